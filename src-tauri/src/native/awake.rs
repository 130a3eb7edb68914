//! Keeping the machine awake while a run trains: a hold is taken when the run's status
//! becomes running and dropped (which releases it) when it pauses, stops, finishes or
//! fails. Where the platform cannot hold (Linux here), the hold is a no-op.

use ostinato_engine::run_state::RunStatus;

/// A held wake lock; dropping it releases it.
pub trait Hold: Send {}

/// Takes holds. The app's takes the OS's; tests count.
pub trait Acquire: Send {
    fn acquire(&mut self) -> Result<Box<dyn Hold>, String>;
}

enum State {
    Released,
    /// Kept only to be dropped: that releases it.
    Held {
        _hold: Box<dyn Hold>,
    },
    /// The OS refused while the run was running: not asked again until it stops running,
    /// so a missing service costs one attempt per run, not one per step.
    Refused,
}

/// The hold, following the run's status.
pub struct KeepAwake<A: Acquire> {
    acquire: A,
    state: State,
}

impl<A: Acquire> KeepAwake<A> {
    pub fn new(acquire: A) -> Self {
        KeepAwake { acquire, state: State::Released }
    }

    /// Follows the run's status: held while running, released otherwise.
    pub fn follow(&mut self, status: RunStatus) {
        match (status == RunStatus::Running, &self.state) {
            (true, State::Released) => {
                self.state = match self.acquire.acquire() {
                    Ok(hold) => State::Held { _hold: hold },
                    Err(e) => {
                        eprintln!("ostinato: could not keep the machine awake during the run: {e}");
                        State::Refused
                    }
                }
            }
            (false, _) => self.state = State::Released,
            (true, _) => {}
        }
    }

    pub fn is_held(&self) -> bool {
        matches!(self.state, State::Held { .. })
    }
}

/// The OS's wake lock: the system stays awake (the display may sleep) while the run trains.
pub struct SystemAwake;

#[cfg(any(target_os = "macos", windows))]
impl Hold for keepawake::KeepAwake {}

impl Acquire for SystemAwake {
    #[cfg(any(target_os = "macos", windows))]
    fn acquire(&mut self) -> Result<Box<dyn Hold>, String> {
        let hold = keepawake::Builder::default()
            .idle(true)
            .reason("Training a LoRA adapter")
            .app_name("Ostinato")
            .app_reverse_domain("app.ostinato.desktop")
            .create()
            .map_err(|e| e.to_string())?;
        Ok(Box::new(hold))
    }

    /// No wake lock here: a no-op hold.
    #[cfg(not(any(target_os = "macos", windows)))]
    fn acquire(&mut self) -> Result<Box<dyn Hold>, String> {
        struct NoHold;
        impl Hold for NoHold {}
        Ok(Box::new(NoHold))
    }
}
