//! A/B at the same seed: the adapters the window can pick (every run's kept ones), a
//! pair made from a run in two voices, and the pairs it keeps, listed again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ostinato_engine::train::ab::{generate_pair_for_run, new_pair_dir, run_pairs, AbVoice, PairRequest, RunPair, Side};
use ostinato_engine::train::state::kept_adapters;

use super::error::{engine_err, setting_err, BridgeError};
use super::outgoing::{EventSink, Outgoing};
use super::state::AppState;
use super::views::{AdapterChoiceView, PairChoices, PairProgress, PairSideView, PairView, SongStage};

impl AppState {
    /// Every adapter the runs keep (each run's final, best and kept checkpoints'), the
    /// newest runs first: what Generate can mix in and an A/B side can be.
    pub fn adapter_choices(&self) -> Result<Vec<AdapterChoiceView>, BridgeError> {
        let mut choices = Vec::new();
        for run in self.list_runs()? {
            let summary = run.summary;
            for adapter in kept_adapters(&summary.dir).map_err(engine_err)? {
                choices.push(AdapterChoiceView { run: summary.name.clone(), run_dir: summary.dir.clone(), adapter });
            }
        }
        Ok(choices)
    }

    /// Every pair made from the run in `dir`, oldest first.
    pub fn pairs(&self, dir: &Path) -> Result<Vec<PairView>, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        Ok(run_pairs(&dir).map_err(engine_err)?.into_iter().map(PairView::of).collect())
    }

    /// Starts an A/B pair from the run in `dir`; its progress goes to `sink` as `pair`
    /// events under the returned id. The request is checked first (an error names its
    /// field: `a.step`, `b.adapters[1].scale`, `song.seed`). A live run is refused: a
    /// pair loads a model of its own, a second copy beside the one training.
    pub fn generate_pair(&self, dir: &Path, choices: PairChoices, sink: impl EventSink) -> Result<u64, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        if self.lock().run.live_control(&dir).is_some() {
            return Err(BridgeError::Invalid(
                "the run is training: make A/B pairs once it has stopped or finished (Generate works meanwhile)".into(),
            ));
        }
        for (side, voice) in [("a", &choices.a), ("b", &choices.b)] {
            self.check_voice_adapters(side, voice)?;
        }
        let request = PairRequest { a: choices.a, b: choices.b, song: choices.song.spec() };
        request.specs(&dir).map_err(setting_err)?;
        let id = self.lock().take_song_id();
        let out = new_pair_dir(&dir, request.song.seed);
        let sink: Arc<dyn EventSink> = Arc::new(sink);
        let send = move |side: Side, stage: SongStage| sink.send(Outgoing::Pair(&PairProgress { id, side, stage }));
        send(Side::A, SongStage::Waiting { live: false });
        std::thread::Builder::new()
            .name("ostinato-pair".into())
            .spawn(move || {
                let mut at = Side::A;
                let made = generate_pair_for_run(&dir, &request, &out, &mut |side, e| {
                    at = side;
                    send(side, SongStage::of(e));
                });
                if let Err(e) = made {
                    send(at, SongStage::Failed { message: e.to_string() });
                }
            })
            .map_err(|source| BridgeError::Io { context: "starting the pair's thread".into(), source })?;
        Ok(id)
    }

    /// Each adapter folder a voice names, inside the runs folder (as the pickers offer them).
    fn check_voice_adapters(&self, side: &str, voice: &AbVoice) -> Result<(), BridgeError> {
        let paths: Vec<(String, &PathBuf)> = match voice {
            AbVoice::Base | AbVoice::Step { .. } => Vec::new(),
            AbVoice::Adapter { path, .. } => vec![(format!("{side}.path"), path)],
            AbVoice::Mix { adapters } => {
                adapters.iter().enumerate().map(|(i, m)| (format!("{side}.adapters[{i}].path"), &m.path)).collect()
            }
        };
        for (field, path) in paths {
            self.checked_adapter_dir(path, &field)?;
        }
        Ok(())
    }
}

impl PairView {
    fn of(pair: RunPair) -> Self {
        let side =
            |voice: Option<&AbVoice>, path: Option<PathBuf>| PairSideView { voice: voice.map(AbVoice::describe), path };
        let request = pair.request.as_ref().ok();
        let song = request.map(|r| &r.song);
        PairView {
            caption: song.map(|s| s.caption.clone()),
            seed: song.map(|s| s.seed),
            seconds: song.map(|s| s.duration_seconds),
            a: side(request.map(|r| &r.a), pair.a),
            b: side(request.map(|r| &r.b), pair.b),
            problem: pair.request.err(),
            dir: pair.dir,
        }
    }
}
