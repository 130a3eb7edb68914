//! The engine: the only place the app calls it (apart from the dataset scan and the
//! settings' conversion into a run config, in their own files). Below the rest of the
//! bridge: it knows only the bridge's views, errors and start request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use ostinato_engine::charts::{render_svg, Chart, Theme};
use ostinato_engine::codec::StereoAudio;
use ostinato_engine::events::{read_events, Event};
use ostinato_engine::export::export_run;
use ostinato_engine::generate::GenerateSpec;
use ostinato_engine::label::saved_labels;
use ostinato_engine::label::store::LabelStore;
use ostinato_engine::run_state::RunState;
use ostinato_engine::train::history::RunSummary;
use ostinato_engine::train::songs::{as_the_model_hears, SongUpdate};
use ostinato_engine::train::{fit, history, Run, RunConfig, RunControl, RunHandle};
use ostinato_engine::Error as EngineError;

use super::error::{engine_err, BridgeError};
use super::run_settings::{run_config, StartRequest};
use super::views::{Charts, ExportFormat, MemoryView};

/// The size charts are drawn at: about the size the window shows them at, so their
/// labels keep the size they are drawn with.
const CHART_SIZE: (u32, u32) = (440, 184);

/// `OSTINATO_RUNS_DIR`, else the engine's default (the one the CLI uses too).
pub fn default_runs_dir() -> PathBuf {
    std::env::var_os("OSTINATO_RUNS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(ostinato_engine::train::config::default_runs_dir)
}

/// Control of a run the engine is training (the engine's `RunControl` in the app, a
/// recorder in tests).
pub trait EngineRun: Send {
    fn pause(&self) -> Result<(), BridgeError>;
    fn resume(&self) -> Result<(), BridgeError>;
    fn stop(&self) -> Result<(), BridgeError>;
    /// The run directory (`<runs>/<run-id>`).
    fn run_dir(&self) -> PathBuf;
    /// Asks the run for a song at its next step boundary, written to `out`.
    fn generate(&self, spec: GenerateSpec, out: PathBuf) -> Result<Receiver<SongUpdate>, BridgeError>;
}

struct Handle {
    control: RunControl,
    run_dir: PathBuf,
}

impl EngineRun for Handle {
    fn pause(&self) -> Result<(), BridgeError> {
        self.control.pause();
        Ok(())
    }
    fn resume(&self) -> Result<(), BridgeError> {
        self.control.resume();
        Ok(())
    }
    fn stop(&self) -> Result<(), BridgeError> {
        self.control.stop();
        Ok(())
    }
    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone()
    }
    fn generate(&self, spec: GenerateSpec, out: PathBuf) -> Result<Receiver<SongUpdate>, BridgeError> {
        self.control.generate(spec, out).map_err(engine_err)
    }
}

/// The run's control and its events; the handle's thread is joined by the relay thread
/// once the events end.
fn attach(handle: RunHandle) -> (Box<dyn EngineRun>, Receiver<Event>) {
    let control = Handle { control: handle.control(), run_dir: handle.run_dir().to_path_buf() };
    let (tx, rx) = std::sync::mpsc::channel::<Event>();
    std::thread::Builder::new()
        .name("ostinato-run-events".into())
        .spawn(move || {
            for event in handle.events().iter() {
                if tx.send(event).is_err() {
                    break;
                }
            }
            let _ = handle.join();
        })
        .expect("spawning the run event thread");
    (Box::new(control), rx)
}

/// The run the request starts: the settings' config with the labels kept for its songs,
/// fitted to this machine when they ask.
fn planned_config(req: &StartRequest) -> Result<RunConfig, BridgeError> {
    let mut config = run_config(req);
    config.data.labels = saved_labels(&LabelStore::new(&req.labels_dir), &req.dataset_dir).map_err(engine_err)?;
    if req.settings.fit_memory {
        fit::fit_auto(&mut config).map_err(engine_err)?;
    }
    Ok(config)
}

pub fn start(req: &StartRequest) -> Result<(Box<dyn EngineRun>, Receiver<Event>), BridgeError> {
    Run::start(planned_config(req)?).map(attach).map_err(engine_err)
}

/// The engine's plan for the settings: fitted when they ask, else as given; a
/// plan that does not fit carries the engine's reason.
pub fn memory_plan(req: &StartRequest) -> Result<MemoryView, BridgeError> {
    let mut config = run_config(req);
    let model = config.model.kind().map_err(engine_err)?.map(|k| k.label());
    let given = fit::plan(&config).map_err(engine_err)?;
    let plan = match req.settings.fit_memory {
        true => fit::fit_auto(&mut config),
        false => fit::check(&given).map(|()| given.clone()),
    };
    match plan {
        Ok(p) => Ok(MemoryView { model, summary: p.summary(), fits: true, changes: p.changes, problem: None }),
        Err(e @ EngineError::WontFit { .. }) => Ok(MemoryView {
            model,
            summary: given.summary(),
            fits: false,
            changes: Vec::new(),
            problem: Some(e.to_string()),
        }),
        Err(e) => Err(engine_err(e)),
    }
}

pub fn resume(run_dir: &Path) -> Result<(Box<dyn EngineRun>, Receiver<Event>), BridgeError> {
    Run::resume(run_dir).map(attach).map_err(engine_err)
}

/// Every run under `runs_dir`, summarised by the engine from its files.
pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunSummary>, BridgeError> {
    history::list_runs(runs_dir).map_err(engine_err)
}

/// The charts of a run's state, drawn by the engine, with their readouts.
pub fn render_charts(run: &RunState, dark: bool) -> Result<Charts, BridgeError> {
    let theme = if dark { Theme::Dark } else { Theme::Light };
    let mut readouts = BTreeMap::new();
    let mut draw = |chart, name: &str| -> Result<String, BridgeError> {
        let drawn = render_svg(chart, run, CHART_SIZE, theme).map_err(engine_err)?;
        readouts.insert(name.to_string(), drawn.readout);
        Ok(drawn.svg)
    };
    let (loss, throughput) = (draw(Chart::Loss, "loss")?, draw(Chart::Throughput, "throughput")?);
    let (memory, noise_levels) = (draw(Chart::Memory, "memory")?, draw(Chart::NoiseLevel, "noise_levels")?);
    Ok(Charts { loss, throughput, memory, noise_levels, readouts })
}

/// The charts of a past run, replayed from its `events.jsonl`.
pub fn replay_charts(log: &Path, dark: bool) -> Result<Charts, BridgeError> {
    render_charts(&RunState::replay(&read_events(log).map_err(engine_err)?), dark)
}

/// Into the folder `to`: `<run>-adapter/` (or `-peft/`, `-lycoris/`), `<run>-comfyui.safetensors`,
/// `<run>-merged.safetensors` or `<run>-merged-model/`.
pub fn export(run_dir: &Path, format: ExportFormat, to: &Path) -> Result<PathBuf, BridgeError> {
    let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let target = match format {
        ExportFormat::Adapter => to.join(format!("{run}-adapter")),
        ExportFormat::Peft => to.join(format!("{run}-peft")),
        ExportFormat::Lycoris => to.join(format!("{run}-lycoris")),
        ExportFormat::Comfyui => to.join(format!("{run}-comfyui.safetensors")),
        ExportFormat::Merged => to.join(format!("{run}-merged.safetensors")),
        ExportFormat::MergedModel => to.join(format!("{run}-merged-model")),
    };
    export_run(run_dir, format, &target).map_err(engine_err)
}

/// The dataset song `song` as the model of a run of `req` hears it: its cached latents
/// decoded; an error saying so when they are not cached.
pub fn heard_by_model(req: &StartRequest, song: &Path) -> Result<StereoAudio, BridgeError> {
    as_the_model_hears(&planned_config(req)?, song).map_err(engine_err)?.ok_or_else(|| {
        BridgeError::Invalid(format!(
            "{} has no cached latents with these settings: train with the latent cache on first",
            song.display()
        ))
    })
}
