//! Phase timings, printed to stderr when the environment variable
//! `SWITCHYARD_TIMINGS` is set: a debug aid for the cost of lowering large
//! clusters (docs/msccl.md "Cluster size"). Off, a lap costs one branch.

use std::time::Instant;

/// A stopwatch that prints each phase's seconds as it ends.
pub struct Laps {
    what: &'static str,
    since: Option<Instant>,
}

impl Laps {
    /// Starts timing `what` if `SWITCHYARD_TIMINGS` is set.
    pub fn start(what: &'static str) -> Laps {
        Laps {
            what,
            since: std::env::var_os("SWITCHYARD_TIMINGS").map(|_| Instant::now()),
        }
    }

    /// Ends `phase`: prints its seconds and starts the next one.
    pub fn lap(&mut self, phase: &str) {
        if let Some(t) = &mut self.since {
            eprintln!(
                "timing {}: {phase} {:.3} s",
                self.what,
                t.elapsed().as_secs_f64()
            );
            *t = Instant::now();
        }
    }

    /// Prints `note` beside the timings (a retry's reason), if timing.
    pub fn note(&self, note: &str) {
        if self.since.is_some() {
            eprintln!("timing {}: {note}", self.what);
        }
    }
}
