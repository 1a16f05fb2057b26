//! Progress on stderr for work that takes more than a second: a bar for
//! simulations (transfers finished of all), a spinner with the elapsed time
//! for runs. Drawn only when stderr is a terminal, so redirected output and
//! tests see nothing of it.

use std::io::IsTerminal;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Work shorter than this shows no progress at all.
const SHOW_AFTER: Duration = Duration::from_secs(1);

fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A progress bar over a simulation's transfers that appears once the
/// simulation has run for a second. Feed it with [`SimProgress::update`]
/// (the simulator's progress callback); [`SimProgress::finish`] clears it.
pub struct SimProgress {
    label: String,
    started: Instant,
    bar: Option<ProgressBar>,
    enabled: bool,
}

impl SimProgress {
    pub fn new(label: impl Into<String>) -> Self {
        SimProgress {
            label: label.into(),
            started: Instant::now(),
            bar: None,
            enabled: on_terminal(),
        }
    }

    pub fn update(&mut self, finished: usize, total: usize) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() && self.started.elapsed() >= SHOW_AFTER {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} transfers ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_message(self.label.clone());
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(finished as u64);
        }
    }

    /// A callback for [`switchyard::compiler::sim::simulate_with_progress`].
    pub fn callback(&mut self) -> impl FnMut(usize, usize) + '_ {
        move |finished, total| self.update(finished, total)
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A spinner with the elapsed time, shown from one second on while the
/// guard lives (for work that reports no progress of its own).
pub struct Spinner {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Spinner {
    pub fn start(message: impl Into<String>) -> Self {
        if !on_terminal() {
            return Spinner {
                stop: None,
                thread: None,
            };
        }
        let message = message.into();
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Stopped (or the guard dropped) within the second: nothing drawn.
            if rx.recv_timeout(SHOW_AFTER) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_message(message);
            bar.enable_steady_tick(Duration::from_millis(120));
            let _ = rx.recv();
            bar.finish_and_clear();
        });
        Spinner {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread either way.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
