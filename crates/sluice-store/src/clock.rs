//! Where stores read the time. `sluice-core` never does; stores do, through
//! this trait, so that tests can drive time by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Re-reads whatever the clock derives from (see [`SystemClock`]).
    fn resync(&self) {}
}

/// The system's wall clock, read cheaply.
///
/// Decisions need epoch milliseconds (aligned windows start at multiples of
/// their period since the epoch), but the wall clock costs a system call's
/// worth of time on every read. This clock reads the CPU's monotonic counter
/// (`quanta`, a few nanoseconds) and adds an offset to the wall clock, which
/// [`SystemClock::resync`] refreshes; the server does so every few seconds,
/// so drift between the two stays far below a millisecond.
#[derive(Debug)]
pub struct SystemClock {
    counter: quanta::Clock,
    /// The counter's raw reading at the origin.
    origin: u64,
    /// Wall-clock milliseconds at `origin`, as last measured.
    origin_ms: AtomicU64,
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        let counter = quanta::Clock::new();
        let origin = counter.raw();
        SystemClock {
            counter,
            origin,
            origin_ms: AtomicU64::new(wall_ms()),
        }
    }
}

impl SystemClock {
    /// Re-reads the wall clock so that counter drift (and wall-clock steps)
    /// are picked up.
    pub fn resync(&self) {
        self.origin_ms.store(
            wall_ms().saturating_sub(self.elapsed_ms()),
            Ordering::Relaxed,
        );
    }

    fn elapsed_ms(&self) -> u64 {
        self.counter.delta_as_nanos(self.origin, self.counter.raw()) / 1_000_000
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        self.origin_ms.load(Ordering::Relaxed) + self.elapsed_ms()
    }

    fn resync(&self) {
        SystemClock::resync(self);
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(now_ms))
    }

    /// Sets the time.
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_follows_the_wall_clock() {
        let clock = SystemClock::default();
        let wall = wall_ms();
        assert!(clock.now_ms().abs_diff(wall) <= 5);
        std::thread::sleep(std::time::Duration::from_millis(30));
        clock.resync();
        let (a, b) = (clock.now_ms(), wall_ms());
        assert!(a.abs_diff(b) <= 5, "{a} vs {b}");
    }
}
