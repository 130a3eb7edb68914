//! A decoder that panics on one file (symphonia asserts on some damaged headers, e.g.
//! a WAV stating a sample rate of 0) fails that file, not the run: the panic becomes
//! the file's error, and is not printed as if the program had crashed.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs guarded code: its panics are reported as errors.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic inside it is returned as `Err` with its message.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                print(info);
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    result.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(format!("the decoder failed on this file ({message})"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_other_panics_still_unwind() {
        let r: Result<(), String> = guarded(|| panic!("TimeBase cannot have 0 numerator or denominator"));
        assert_eq!(r.unwrap_err(), "the decoder failed on this file (TimeBase cannot have 0 numerator or denominator)");
        assert_eq!(guarded(|| Ok(3)), Ok(3));
        // Outside a guard a panic is still a panic.
        assert!(catch_unwind(|| panic!("not guarded")).is_err());
    }
}
