//! A/B at the same seed: one song request heard in two voices of a run (the base
//! model, its adapter at a kept step, another adapter folder, a mix of several), made
//! by a `Generator` loaded for the run's model. Each pair is kept in its own folder of
//! the run, the request first (`pair.json`), then each side as a song is kept
//! (`a.wav` with the request it was made from beside it, `songs::save_song`), so the
//! pairs can be listed and played again in a later session.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::RunConfig;
use super::songs::{save_song, song_request, stamped};
use super::state;
use crate::atomic::write_atomically;
use crate::cancel::Cancel;
use crate::generate::planned::{load_planner, plan_song};
use crate::generate::{GenerateEvent, GenerateSpec, Generator, MixedAdapter};
use crate::{Error, Result};

/// The folder of a run's A/B pairs.
pub const PAIRS_DIR: &str = "ab";
const REQUEST_FILE: &str = "pair.json";

/// Who sings one side of a pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AbVoice {
    /// The base model, no adapter.
    Base,
    /// The run's own adapter as its checkpoint of `step` keeps it.
    Step { step: u64, scale: f64 },
    /// An adapter folder (another run's) at its strength.
    Adapter { path: PathBuf, scale: f64 },
    /// Several adapter folders, each at its strength.
    Mix { adapters: Vec<MixedAdapter> },
}

impl AbVoice {
    /// The voice in words: "the base model", "step 40 at 1", "run-a/final at 0.5", a mix
    /// of those joined by " + ".
    pub fn describe(&self) -> String {
        match self {
            AbVoice::Base => "the base model".into(),
            AbVoice::Step { step, scale } => format!("step {step} at {scale}"),
            AbVoice::Adapter { path, scale } => format!("{} at {scale}", adapter_name(path)),
            AbVoice::Mix { adapters } => adapters
                .iter()
                .map(|m| format!("{} at {}", adapter_name(&m.path), m.scale))
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

/// An adapter folder by the names that tell it apart: `runs/a/final/adapter` is "a/final",
/// `runs/a/checkpoints/step-000040/adapter` "a/step-000040".
fn adapter_name(path: &Path) -> String {
    let mut names: Vec<String> = path
        .components()
        .rev()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|c| c != "adapter" && c != "checkpoints")
        .take(2)
        .collect();
    names.reverse();
    names.join("/")
}

/// One side of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    A,
    B,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::A => "a",
            Side::B => "b",
        }
    }
}

/// Two voices and the song both make: caption, lyrics, duration, seed, steps,
/// guidance and the rest of `song` shared; its adapter fields are the voices' to set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairRequest {
    pub a: AbVoice,
    pub b: AbVoice,
    pub song: GenerateSpec,
}

impl PairRequest {
    /// The two songs to make for the run in `run_dir`: each side's voice on the shared
    /// song, checked (an error named by its field: `a`, `b.adapters[1].scale`, `song.seed`).
    pub fn specs(&self, run_dir: &Path) -> Result<[GenerateSpec; 2]> {
        if self.a == self.b {
            return Err(Error::setting("b", "the same voice as A: pick two different voices to compare"));
        }
        let shared = &self.song;
        if shared.adapter.is_some() || !shared.more_adapters.is_empty() || shared.adapter_scale != 1.0 {
            return Err(Error::setting("song.adapter", "a pair's adapters are its voices' to choose, not the song's"));
        }
        shared.validate().map_err(|e| prefixed("song", e))?;
        Ok([self.spec(Side::A, run_dir)?, self.spec(Side::B, run_dir)?])
    }

    fn spec(&self, side: Side, run_dir: &Path) -> Result<GenerateSpec> {
        let name = side.name();
        let voice = match side {
            Side::A => &self.a,
            Side::B => &self.b,
        };
        let song = self.song.clone();
        let spec = match voice {
            AbVoice::Base => GenerateSpec { adapter_scale: 0.0, ..song },
            AbVoice::Step { step, scale } => {
                let dir = state::step_adapter_dir(run_dir, *step);
                if !dir.is_dir() {
                    let kept = state::kept_adapter_steps(run_dir)?;
                    let why = format!("the run keeps no adapter of step {step} (it keeps steps {kept:?})");
                    return Err(Error::setting(&format!("{name}.step"), why));
                }
                GenerateSpec { adapter: Some(dir), adapter_scale: *scale, ..song }
            }
            AbVoice::Adapter { path, scale } => {
                GenerateSpec { adapter: Some(path.clone()), adapter_scale: *scale, ..song }
            }
            AbVoice::Mix { adapters } if adapters.len() < 2 => {
                return Err(Error::setting(&format!("{name}.adapters"), "a mix needs two adapters or more"));
            }
            AbVoice::Mix { adapters } => {
                let (paths, scales): (Vec<PathBuf>, Vec<f64>) =
                    adapters.iter().map(|m| (m.path.clone(), m.scale)).unzip();
                song.with_adapters(paths, &scales)?
            }
        };
        spec.validate().map_err(|e| prefixed(name, voice_field(e, voice)))?;
        Ok(spec)
    }
}

/// A resolved spec's field as the voice names it: a mix's `adapter_scale` and
/// `more_adapters[i].scale` are its `adapters[0].scale` and `adapters[i + 1].scale`,
/// a single adapter's `adapter_scale` its `scale`.
fn voice_field(e: Error, voice: &AbVoice) -> Error {
    let Error::Setting { field, reason } = e else { return e };
    let field = match (voice, field.as_str()) {
        (AbVoice::Mix { .. }, "adapter_scale") => "adapters[0].scale".to_string(),
        (AbVoice::Mix { .. }, more) if more.starts_with("more_adapters[") => {
            let i: usize = more["more_adapters[".len()..].split(']').next().and_then(|i| i.parse().ok()).unwrap_or(0);
            format!("adapters[{}].scale", i + 1)
        }
        (_, "adapter_scale") => "scale".to_string(),
        _ => field,
    };
    Error::Setting { field, reason }
}

fn prefixed(prefix: &str, e: Error) -> Error {
    match e {
        Error::Setting { field, reason } => Error::Setting { field: format!("{prefix}.{field}"), reason },
        e => e,
    }
}

/// A kept pair: its folder, its request (or why it cannot be read), and each side's
/// WAV when it was made (a pair cut short by a crash or a failure has none).
#[derive(Debug, Clone, PartialEq)]
pub struct RunPair {
    pub dir: PathBuf,
    pub request: std::result::Result<PairRequest, String>,
    pub a: Option<PathBuf>,
    pub b: Option<PathBuf>,
}

impl RunPair {
    fn read(dir: PathBuf) -> Self {
        let file = dir.join(REQUEST_FILE);
        let request = std::fs::read_to_string(&file)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|text| serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display())));
        let side = |side: Side| {
            let wav = side_wav(&dir, side);
            (wav.is_file() && song_request(&wav).is_ok()).then_some(wav)
        };
        Self { a: side(Side::A), b: side(Side::B), request, dir }
    }
}

fn side_wav(pair_dir: &Path, side: Side) -> PathBuf {
    pair_dir.join(format!("{}.wav", side.name()))
}

/// A new folder for a pair of `run_dir`: `ab/pair-<unix ms>-seed<seed>`.
pub fn new_pair_dir(run_dir: &Path, seed: u64) -> PathBuf {
    run_dir.join(PAIRS_DIR).join(stamped("pair", seed))
}

/// Every pair made from the run in `run_dir`, oldest first; none before the first.
pub fn run_pairs(run_dir: &Path) -> Result<Vec<RunPair>> {
    let root = run_dir.join(PAIRS_DIR);
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(|e| Error::io(&root, e))? {
        let path = entry.map_err(|e| Error::io(&root, e))?.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("pair-")) {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs.into_iter().map(RunPair::read).collect())
}

/// Makes both sides of `request` with the model of the run in `run_dir` into `out` (a
/// new folder, [`new_pair_dir`]), A then B, each step reported with its side. The
/// request is checked before the models load, and kept before the first song is made.
/// A song that asks for a 5 Hz LM plan is planned once, for both sides (reported on A):
/// the same metadata and audio codes, so only the voice differs.
pub fn generate_pair_for_run(
    run_dir: &Path,
    request: &PairRequest,
    out: &Path,
    on_event: &mut dyn FnMut(Side, GenerateEvent),
) -> Result<RunPair> {
    request.specs(run_dir)?;
    let config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
    let planner = load_planner(&request.song)?;
    let generator = Generator::load(&config.model)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    write_atomically(&out.join(REQUEST_FILE), &serde_json::to_vec_pretty(request).expect("a request serialises"))?;
    let song = plan_song(&request.song, planner.as_ref(), &Cancel::never(), &mut |e| on_event(Side::A, e))?;
    drop(planner);
    let specs = PairRequest { song, ..request.clone() }.specs(run_dir)?;
    for (side, spec) in [Side::A, Side::B].into_iter().zip(&specs) {
        let latents = generator.latents(spec, &mut |e| on_event(side, e))?;
        let audio = generator.decode(&latents, &mut |e| on_event(side, e))?;
        let wav = side_wav(out, side);
        save_song(&wav, &audio, spec)?;
        on_event(
            side,
            GenerateEvent::Written { path: wav, seconds: audio.duration_seconds(), sample_rate: audio.sample_rate },
        );
    }
    Ok(RunPair::read(out.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::StereoAudio;

    fn field_of(request: &PairRequest, run_dir: &Path) -> String {
        match request.specs(run_dir) {
            Err(Error::Setting { field, reason }) => {
                println!("{field}: {reason}");
                field
            }
            other => panic!("not a setting error: {other:?}"),
        }
    }

    fn adapter(path: &str, scale: f64) -> MixedAdapter {
        MixedAdapter { path: path.into(), scale }
    }

    #[test]
    fn a_pair_shares_its_song_and_each_voice_sets_only_the_adapters() {
        let run = tempfile::tempdir().unwrap();
        let step_dir = state::step_adapter_dir(run.path(), 4);
        std::fs::create_dir_all(&step_dir).unwrap();
        let song = GenerateSpec { caption: "plucks".into(), seed: 9, steps: Some(4), ..Default::default() };
        let mix = AbVoice::Mix { adapters: vec![adapter("/x", 0.5), adapter("/y", 1.5)] };
        let request = PairRequest { a: AbVoice::Step { step: 4, scale: 1.0 }, b: mix, song: song.clone() };
        let [a, b] = request.specs(run.path()).unwrap();
        assert_eq!(a, GenerateSpec { adapter: Some(step_dir), ..song.clone() });
        assert_eq!(
            b,
            GenerateSpec {
                adapter: Some("/x".into()),
                adapter_scale: 0.5,
                more_adapters: vec![adapter("/y", 1.5)],
                ..song.clone()
            }
        );
        let base = PairRequest { a: AbVoice::Base, ..request.clone() };
        assert_eq!(base.specs(run.path()).unwrap()[0], GenerateSpec { adapter_scale: 0.0, ..song.clone() });
        let json = serde_json::to_string(&request).unwrap();
        assert_eq!(serde_json::from_str::<PairRequest>(&json).unwrap(), request);
    }

    #[test]
    fn voices_are_said_by_the_names_that_tell_them_apart() {
        let final_dir = PathBuf::from("/runs/calm/final/adapter");
        let step_dir = PathBuf::from("/runs/loud/checkpoints/step-000040/adapter");
        let said = [
            AbVoice::Base,
            AbVoice::Step { step: 40, scale: 1.0 },
            AbVoice::Adapter { path: final_dir.clone(), scale: 0.5 },
            AbVoice::Mix {
                adapters: vec![adapter("/runs/calm/final/adapter", 1.0), adapter(step_dir.to_str().unwrap(), 0.25)],
            },
        ]
        .map(|v| v.describe());
        assert_eq!(
            said,
            ["the base model", "step 40 at 1", "calm/final at 0.5", "calm/final at 1 + loud/step-000040 at 0.25"]
        );
    }

    #[test]
    fn a_bad_pair_is_refused_by_the_field_at_fault() {
        let run = tempfile::tempdir().unwrap();
        let song = GenerateSpec { caption: "plucks".into(), ..Default::default() };
        let pair = |a: AbVoice, b: AbVoice, song: &GenerateSpec| PairRequest { a, b, song: song.clone() };
        let other = AbVoice::Adapter { path: "/x".into(), scale: 1.0 };
        let cases = [
            (pair(AbVoice::Base, AbVoice::Base, &song), "b"),
            (pair(other.clone(), other.clone(), &song), "b"),
            (pair(AbVoice::Step { step: 2, scale: 1.0 }, AbVoice::Base, &song), "a.step"),
            (pair(AbVoice::Base, AbVoice::Adapter { path: "/x".into(), scale: 9.0 }, &song), "b.scale"),
            (pair(AbVoice::Base, AbVoice::Mix { adapters: vec![adapter("/x", 1.0)] }, &song), "b.adapters"),
            (
                pair(AbVoice::Base, AbVoice::Mix { adapters: vec![adapter("/x", 1.0), adapter("/y", -1.0)] }, &song),
                "b.adapters[1].scale",
            ),
            (
                pair(AbVoice::Base, other.clone(), &GenerateSpec { adapter: Some("/z".into()), ..song.clone() }),
                "song.adapter",
            ),
            (pair(AbVoice::Base, other.clone(), &GenerateSpec { steps: Some(0), ..song.clone() }), "song.steps"),
        ];
        for (request, field) in cases {
            assert_eq!(field_of(&request, run.path()), field, "{request:?}");
        }
    }

    #[test]
    fn kept_pairs_are_listed_with_their_requests_and_the_sides_made() {
        let run = tempfile::tempdir().unwrap();
        assert_eq!(run_pairs(run.path()).unwrap(), [], "no ab folder yet: no pairs");
        let request = PairRequest {
            a: AbVoice::Base,
            b: AbVoice::Adapter { path: "/x".into(), scale: 0.5 },
            song: GenerateSpec { caption: "plucks".into(), seed: 3, ..Default::default() },
        };
        let [a, b] = request.specs(run.path()).unwrap();
        let audio = StereoAudio { sample_rate: 48_000, left: vec![0.1; 480], right: vec![-0.1; 480] };
        let (done, cut) =
            (run.path().join(PAIRS_DIR).join("pair-100-seed3"), run.path().join(PAIRS_DIR).join("pair-200-seed3"));
        for dir in [&done, &cut] {
            std::fs::create_dir_all(dir).unwrap();
            write_atomically(&dir.join(REQUEST_FILE), &serde_json::to_vec(&request).unwrap()).unwrap();
            save_song(&side_wav(dir, Side::A), &audio, &a).unwrap();
        }
        save_song(&side_wav(&done, Side::B), &audio, &b).unwrap();
        std::fs::write(run.path().join(PAIRS_DIR).join("notes.txt"), b"").unwrap();

        let listed = run_pairs(run.path()).unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        let made = RunPair {
            dir: done.clone(),
            request: Ok(request.clone()),
            a: Some(side_wav(&done, Side::A)),
            b: Some(side_wav(&done, Side::B)),
        };
        assert_eq!(listed[0], made);
        assert_eq!((listed[1].a.is_some(), listed[1].b.is_none()), (true, true), "B was never made: {:?}", listed[1]);
        std::fs::write(cut.join(REQUEST_FILE), "{").unwrap();
        let why = run_pairs(run.path()).unwrap()[1].request.clone().unwrap_err();
        assert!(why.contains("pair.json"), "{why}");
    }
}
