//! The CUDA backend's watchdog: a run fails when nothing finishes for the
//! timeout, as the CPU pool's does, not when the run as a whole takes
//! longer. "Something finished" is a progress marker newly found complete
//! (an event the device code polls). Pure logic on instants, so it is tested
//! without a device.

use std::time::{Duration, Instant};

use crate::RuntimeError;

/// Tracks progress markers against the timeout.
#[derive(Clone, Debug)]
pub struct Watchdog {
    timeout: Duration,
    last_progress: Instant,
    finished: usize,
}

impl Watchdog {
    pub fn new(timeout: Duration, now: Instant) -> Watchdog {
        Watchdog {
            timeout,
            last_progress: now,
            finished: 0,
        }
    }

    /// Records that `finished` markers are complete at `now` (counts only
    /// grow while one piece of work runs). Fails with
    /// [`RuntimeError::Timeout`] when none has finished for longer than the
    /// timeout; `done` of `total` name what had finished (streams, stages).
    pub fn observe(
        &mut self,
        finished: usize,
        now: Instant,
        done: usize,
        total: usize,
    ) -> Result<(), RuntimeError> {
        if finished > self.finished {
            self.finished = finished;
            self.last_progress = now;
            return Ok(());
        }
        let idle = now.saturating_duration_since(self.last_progress);
        if idle > self.timeout {
            return Err(RuntimeError::Timeout {
                seconds: idle.as_secs_f64(),
                done,
                total,
            });
        }
        Ok(())
    }

    /// Whether more than the timeout has passed since the last progress
    /// (for waits that have no markers of their own, such as NCCL's).
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_progress) > self.timeout
    }

    /// Seconds since the last progress.
    pub fn idle(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.last_progress)
            .as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_progress_never_fires_however_long_the_run() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(Duration::from_secs(2), t0);
        // A run of 100 s in which something finishes every second.
        for s in 1..=100u64 {
            w.observe(s as usize, t0 + Duration::from_secs(s), 0, 1)
                .unwrap();
        }
    }

    #[test]
    fn nothing_finished_for_the_timeout_fires() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(Duration::from_secs(2), t0);
        w.observe(3, t0 + Duration::from_secs(1), 1, 4).unwrap();
        w.observe(3, t0 + Duration::from_secs(3), 1, 4).unwrap();
        assert!(!w.expired(t0 + Duration::from_secs(3)));
        let e = w
            .observe(3, t0 + Duration::from_millis(3500), 1, 4)
            .unwrap_err();
        assert_eq!(
            e,
            RuntimeError::Timeout {
                seconds: 2.5,
                done: 1,
                total: 4
            }
        );
        assert!(w.expired(t0 + Duration::from_millis(3500)));
        assert_eq!(w.idle(t0 + Duration::from_millis(3500)), 2.5);
    }

    #[test]
    fn a_run_that_never_starts_fires_after_the_timeout() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(Duration::from_millis(500), t0);
        assert!(w.observe(0, t0 + Duration::from_millis(400), 0, 2).is_ok());
        assert!(w.observe(0, t0 + Duration::from_millis(600), 0, 2).is_err());
    }
}
