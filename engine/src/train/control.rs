//! Pause and stop: what the front end asks of a live run from any thread (a signal
//! handler, a UI command), read by the loop at step boundaries, and the hold of a
//! paused run, which still serves the songs asked of it.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::sink::Sink;
use super::songs::{SongRequest, SongUpdate};
use crate::cancel::Cancel;
use crate::events::Event;
use crate::generate::GenerateSpec;
use crate::{Error, Result};

#[derive(Default)]
struct Requests {
    pause: bool,
    stop: bool,
    /// Songs asked for, served at the next step boundary (also while paused).
    songs: Vec<SongRequest>,
    /// The loop is over: no song will be served any more.
    ended: bool,
}

#[derive(Default)]
struct Control {
    requests: Mutex<Requests>,
    wake: Condvar,
    /// Set by a stop as well: setup's long work (dataset preparation) polls it.
    cancel: Cancel,
}

/// What the front end asks at a step boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Asked {
    Train,
    Pause,
    Stop,
}

/// Pause, resume and stop a run from any thread, and ask it for songs.
#[derive(Clone, Default)]
pub struct RunControl(Arc<Control>);

impl RunControl {
    /// Pause at the next step boundary (after writing a checkpoint).
    pub fn pause(&self) {
        self.requests().pause = true;
    }

    /// Continue a paused run.
    pub fn resume(&self) {
        self.requests().pause = false;
        self.0.wake.notify_all();
    }

    /// Stop at the next step boundary (during dataset preparation: before the next
    /// file or encoder chunk): checkpoint and final adapter (once a step is trained),
    /// `stopped`.
    pub fn stop(&self) {
        self.requests().stop = true;
        self.0.cancel.cancel();
        self.0.wake.notify_all();
    }

    /// Asks the run for a song of `spec` with the model and adapter it trains, written to
    /// `out`, made at its next step boundary (at once when paused). Its progress and end
    /// come on the receiver; a run that has ended refuses.
    pub fn generate(&self, spec: GenerateSpec, out: PathBuf) -> Result<Receiver<SongUpdate>> {
        let (updates, rx) = channel();
        let mut r = self.requests();
        if r.ended {
            return Err(Error::BadRequest("the run has ended: generate from its saved adapter".into()));
        }
        r.songs.push(SongRequest { spec, out, updates });
        self.0.wake.notify_all();
        Ok(rx)
    }

    /// Set by a stop: long work in the run polls it.
    pub(super) fn cancel(&self) -> &Cancel {
        &self.0.cancel
    }

    /// What is asked now; a stop outranks a pause.
    pub(super) fn asked(&self) -> Asked {
        let r = self.requests();
        match (r.stop, r.pause) {
            (true, _) => Asked::Stop,
            (false, true) => Asked::Pause,
            (false, false) => Asked::Train,
        }
    }

    /// The songs asked for so far, taken from the queue.
    pub(super) fn take_songs(&self) -> Vec<SongRequest> {
        std::mem::take(&mut self.requests().songs)
    }

    /// Holds a paused run at `step` until it is resumed (`paused`, then `resumed`) or
    /// stopped (true), serving the songs asked meanwhile.
    pub(super) fn hold(&self, step: u64, sink: &mut Sink, mut serve: impl FnMut(Vec<SongRequest>)) -> bool {
        sink.emit(Event::Paused { step });
        let mut r = self.requests();
        while r.pause && !r.stop {
            if r.songs.is_empty() {
                r = self.0.wake.wait(r).expect("control lock");
                continue;
            }
            let songs = std::mem::take(&mut r.songs);
            drop(r);
            serve(songs);
            r = self.requests();
        }
        if r.stop {
            return true;
        }
        sink.emit(Event::Resumed { step });
        false
    }

    /// The loop is over: requests not served are dropped (their requesters hear the run
    /// ended) and new ones are refused.
    pub(super) fn end(&self) {
        let mut r = self.requests();
        (r.ended, r.songs) = (true, Vec::new());
    }

    fn requests(&self) -> MutexGuard<'_, Requests> {
        self.0.requests.lock().expect("control lock")
    }
}
