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

/// The system's wall clock, read cheaply, never going backwards.
///
/// Decisions need epoch milliseconds (aligned windows start at multiples of
/// their period since the epoch), but the wall clock costs a system call's
/// worth of time on every read, and it steps: NTP corrections, a VM resumed,
/// an operator's `date -s`. This clock reads the CPU's monotonic counter
/// (`quanta`, a few nanoseconds) and adds an offset measured against the
/// wall clock at start. [`SystemClock::resync`] (the server calls it every
/// `storage.sweep_interval`) lets the offset follow the wall clock's *drift*: forward by
/// at most [`MAX_SLEW_MS`] per call, never backward. So:
///
/// - time as decisions see it never goes backwards (a wall clock stepped
///   back an hour does not put every bucket an hour in the future);
/// - a wall clock stepped forward is not adopted at once either (it would
///   refill every bucket): the offset catches up by at most `MAX_SLEW_MS`
///   per resync, a rate of 0.1 % at the default resync every 10 s;
/// - a counter running fast against the wall clock (parts per million) is
///   not corrected, so after days the clock may read a few seconds ahead.
#[derive(Debug)]
pub struct SystemClock {
    counter: quanta::Clock,
    /// The counter's raw reading at the origin.
    origin: u64,
    /// Milliseconds per tick of the counter as a binary fraction (2^-64
    /// units): a reading becomes milliseconds in one multiplication (25
    /// instructions a reading under callgrind, against 37 through quanta's
    /// nanoseconds and a division).
    ms_per_tick: u64,
    /// Wall-clock milliseconds at `origin`, as last measured.
    origin_ms: AtomicU64,
    /// Where the wall clock is read (the system's; tests step their own).
    wall: fn() -> u64,
}

/// The most a resync moves the clock forward, in milliseconds.
pub const MAX_SLEW_MS: u64 = 10;

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::with_wall(wall_ms)
    }
}

impl SystemClock {
    /// A clock that follows `wall` (milliseconds since the epoch) instead of
    /// the system's wall clock.
    pub fn with_wall(wall: fn() -> u64) -> SystemClock {
        let counter = quanta::Clock::new();
        let origin = counter.raw();
        SystemClock {
            ms_per_tick: ms_per_tick(&counter),
            counter,
            origin,
            origin_ms: AtomicU64::new(wall()),
            wall,
        }
    }

    /// Lets the clock follow the wall clock's drift (see the type's
    /// documentation): forward by at most [`MAX_SLEW_MS`], never back.
    pub fn resync(&self) {
        let measured = (self.wall)().saturating_sub(self.elapsed_ms());
        let current = self.origin_ms.load(Ordering::Relaxed);
        if measured > current {
            self.origin_ms.fetch_max(
                current + (measured - current).min(MAX_SLEW_MS),
                Ordering::Relaxed,
            );
        }
    }

    fn elapsed_ms(&self) -> u64 {
        ticks_to_ms(
            self.counter.raw().saturating_sub(self.origin),
            self.ms_per_tick,
        )
    }
}

/// Ticks a calibration spans: long enough that the fraction is exact to
/// well under a millisecond a year.
const CALIBRATION_TICKS: u64 = 1 << 40;

/// `counter`'s milliseconds per tick as a fraction of 2^64 (quanta's own
/// scale, read off a long span). A counter of at most a kilohertz would not
/// fit; quanta's are the CPU's (gigahertz) or nanoseconds.
fn ms_per_tick(counter: &quanta::Clock) -> u64 {
    let nanos = u128::from(counter.delta_as_nanos(0, CALIBRATION_TICKS));
    // ms per tick = nanos / (2^40 × 10^6); in units of 2^-64: nanos × 2^24 / 10^6.
    u64::try_from((nanos << 24) / 1_000_000).unwrap_or(u64::MAX)
}

#[inline]
fn ticks_to_ms(ticks: u64, ms_per_tick: u64) -> u64 {
    // At most 2^64 × 2^64 / 2^64: always fits.
    ((u128::from(ticks) * u128::from(ms_per_tick)) >> 64) as u64
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
    fn ticks_become_the_milliseconds_quanta_says_they_are() {
        let counter = quanta::Clock::new();
        let per_tick = ms_per_tick(&counter);
        // From a tick to a century of ticks at 5 GHz.
        let mut ticks = 1u64;
        let century: u64 = 5_000_000_000 * 3_600 * 24 * 365 * 100;
        while ticks < century {
            let quanta_ms = counter.delta_as_nanos(0, ticks) / 1_000_000;
            let ours = ticks_to_ms(ticks, per_tick);
            assert!(
                ours.abs_diff(quanta_ms) <= 1 + quanta_ms / 1_000_000_000,
                "{ticks} ticks: {ours} ms against quanta's {quanta_ms}"
            );
            ticks = ticks.saturating_mul(3).saturating_add(7);
        }
        // Monotonic: a later reading never reads earlier.
        let mut last = 0;
        for ticks in (0..10_000_000u64).step_by(997) {
            let ms = ticks_to_ms(ticks, per_tick);
            assert!(ms >= last);
            last = ms;
        }
    }

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

    /// A wall clock the test steps: the real one plus an offset.
    static STEP: AtomicU64 = AtomicU64::new(HOUR);
    const HOUR: u64 = 3_600_000;

    fn stepped_wall() -> u64 {
        wall_ms() - HOUR + STEP.load(Ordering::SeqCst)
    }

    #[test]
    fn wall_clock_steps_never_move_decisions_back_nor_jump_them_ahead() {
        let clock = SystemClock::with_wall(stepped_wall);
        let start = clock.now_ms();
        STEP.store(0, Ordering::SeqCst); // the wall clock steps back an hour
        let mut last = start;
        for _ in 0..5 {
            clock.resync();
            let now = clock.now_ms();
            assert!(now >= last, "went back: {now} < {last}");
            last = now;
        }
        assert!(last - start < 1_000, "kept its time: {}", last - start);
        STEP.store(2 * HOUR, Ordering::SeqCst); // and forward two hours
        let before = clock.now_ms();
        for _ in 0..5 {
            clock.resync();
        }
        let slewed = clock.now_ms() - before;
        assert!(
            slewed <= 5 * MAX_SLEW_MS + 100,
            "a forward step is slewed, not adopted: moved {slewed} ms"
        );
        assert!(slewed >= 5 * MAX_SLEW_MS, "it does catch up: {slewed} ms");
    }
}
