//! How long a download waits on the hub and how it tries a failed request again:
//! timeouts of seconds (a person is waiting), and a bounded number of retries, each
//! said as it happens, with waits a cancel cuts short.

use std::time::Duration;

use crate::cancel::Cancel;
use crate::Result;

/// A download's timeouts and retry pacing, given to [`super::Hub::new`].
/// `Patience::default()` is what the CLI and the app use; tests pass shorter ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// Setting up a connection (name lookup, TCP, TLS) longer than this fails the try.
    pub connect: Duration,
    /// A server that sends nothing for this long (no response, or no byte of a body
    /// in progress) fails the try.
    pub idle: Duration,
    /// Waited before the first retry of a request, doubled before each next one.
    pub first_retry_after: Duration,
    /// Tries of one request, in a row without a new byte, before giving up.
    pub tries: u32,
}

impl Default for Patience {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            first_retry_after: Duration::from_secs(2),
            tries: 5,
        }
    }
}

/// A failed try that is tried again: try `next_try` of `tries`, after `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub next_try: u32,
    pub tries: u32,
    pub wait: Duration,
}

/// The tries of one request: counts failures in a row and paces the next try.
pub struct Retries {
    patience: Patience,
    failures: u32,
    wait: Duration,
}

impl Retries {
    pub fn new(patience: Patience) -> Self {
        Self { patience, failures: 0, wait: patience.first_retry_after }
    }

    /// A try that got new bytes: the count and the wait start again.
    pub fn progressed(&mut self) {
        *self = Self::new(self.patience);
    }

    /// Counts a failed try: the retry to say and wait for, or `None` when every try
    /// is spent.
    pub fn failed(&mut self) -> Option<Retry> {
        self.failures += 1;
        if self.failures >= self.patience.tries {
            return None;
        }
        let retry = Retry { next_try: self.failures + 1, tries: self.patience.tries, wait: self.wait };
        self.wait *= 2;
        Some(retry)
    }

    pub fn tries(&self) -> u32 {
        self.patience.tries
    }
}

/// Sleeps `wait` in short slices, so a cancel lands within one.
pub fn wait(wait: Duration, cancel: &Cancel) -> Result<()> {
    const SLICE: Duration = Duration::from_millis(100);
    let mut left = wait;
    while !left.is_zero() {
        cancel.check()?;
        let step = left.min(SLICE);
        std::thread::sleep(step);
        left -= step;
    }
    cancel.check()
}

/// `10 s`, `0.2 s`: a duration as a message says it.
pub fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_bounded_doubled_and_restart_after_progress() {
        let p = Patience { first_retry_after: Duration::from_millis(10), tries: 3, ..Patience::default() };
        let mut r = Retries::new(p);
        let ms = Duration::from_millis;
        assert_eq!(r.failed(), Some(Retry { next_try: 2, tries: 3, wait: ms(10) }));
        assert_eq!(r.failed(), Some(Retry { next_try: 3, tries: 3, wait: ms(20) }));
        assert_eq!(r.failed(), None);
        r.progressed();
        assert_eq!(r.failed(), Some(Retry { next_try: 2, tries: 3, wait: ms(10) }));
        assert_eq!((seconds(Duration::from_secs(10)), seconds(ms(200))), ("10 s".into(), "0.2 s".into()));
    }

    #[test]
    fn a_cancel_cuts_a_wait_short() {
        let cancel = Cancel::never();
        cancel.cancel();
        // An hour's wait returns at once: the test would hang otherwise.
        assert!(matches!(wait(Duration::from_secs(3600), &cancel), Err(crate::Error::Cancelled)));
    }
}
