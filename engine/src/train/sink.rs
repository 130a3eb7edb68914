//! Where a run's events go: the run directory's `events.jsonl` (flushed) and the front
//! end's channel. The run's final event also lets go of its directory's lock.

use std::sync::mpsc::Sender;

use super::lock::RunLock;
use crate::events::{Event, EventLog};

pub(super) struct Sink {
    log: EventLog,
    tx: Sender<Event>,
    /// The run directory's lock, let go with the run's final event.
    lock: Option<RunLock>,
}

impl Sink {
    pub fn new(log: EventLog, tx: Sender<Event>, lock: RunLock) -> Self {
        Self { log, tx, lock: Some(lock) }
    }

    pub fn emit(&mut self, event: Event) {
        // A full disk must not kill training: the checkpoint path reports write errors.
        let _ = self.log.append(&event);
        if matches!(event, Event::Finished { .. } | Event::Stopped { .. } | Event::Failed { .. }) {
            // The run ends with this event: whoever sees it and then lists the runs must
            // not find the run live (the training thread ends only later), and the next
            // writer appends after it.
            self.lock = None;
        }
        let _ = self.tx.send(event);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;

    use super::*;
    use crate::train::history;

    #[test]
    fn the_live_marker_is_gone_before_the_final_event_is_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join(crate::train::lock::LIVE_MARKER);
        let (tx, rx) = channel();
        let lock = RunLock::acquire(tmp.path()).unwrap();
        let mut sink = Sink::new(EventLog::open(tmp.path().join("events.jsonl")).unwrap(), tx, lock);
        sink.emit(Event::Paused { step: 1 });
        assert!(marker.exists(), "a paused run is still live");
        assert!(history::is_live(tmp.path()));
        sink.emit(Event::Stopped { step: 1, adapter_path: Some("a".into()) });
        assert!(matches!(rx.recv().unwrap(), Event::Paused { .. }));
        assert!(matches!(rx.recv().unwrap(), Event::Stopped { .. }));
        assert!(!marker.exists());
        assert!(!history::is_live(tmp.path()));
        assert_eq!(history::summarise(tmp.path()).status, history::RunStatus::Stopped);
    }
}
