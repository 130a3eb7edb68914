//! Preprocessed samples on disk: one `<stem>.safetensors` per clip with ACE-Step's
//! preprocessed-tensor keys (f32) plus `manifest.json`; and reading such a folder, or
//! a folder of ACE-Step's own `.pt` files (through the safe torch reader).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::TrainingSample;
use crate::cancel::Cancel;
use crate::codec::{Conditioner, LatentEncoder};
use crate::tensor_io::save_tensors;
use crate::tensor_io::torch_pt::read_pt;
use crate::{Error, Result};

pub const KEYS: [&str; 5] =
    ["target_latents", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", "context_latents"];
pub const MANIFEST: &str = "manifest.json";
pub const FORMAT: &str = "ostinato-preprocessed";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub file: String,
    pub source: PathBuf,
    pub frames: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Ids of the latent encoder and conditioner that made the samples.
    pub encoder: String,
    pub conditioner: String,
    pub samples: Vec<ManifestEntry>,
}

impl Manifest {
    pub fn new(encoder: impl Into<String>, conditioner: impl Into<String>) -> Self {
        Self {
            format: FORMAT.into(),
            version: 1,
            encoder: encoder.into(),
            conditioner: conditioner.into(),
            samples: Vec::new(),
        }
    }
}

fn stem_of(source: &Path) -> String {
    let s: String = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("sample")
        .chars()
        .map(|c| if c.is_alphanumeric() || "-_. ".contains(c) { c } else { '_' })
        .collect();
    if s.is_empty() {
        "sample".into()
    } else {
        s
    }
}

/// Writes every sample and the manifest (its `samples` list is filled in). Files are
/// written to a temporary name and renamed. Returns the files written.
pub fn write_preprocessed(dir: &Path, samples: &[TrainingSample], manifest: &Manifest) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut manifest = manifest.clone();
    manifest.samples.clear();
    let mut used = std::collections::HashSet::new();
    let mut written = Vec::new();
    for s in samples {
        let base = stem_of(&s.source);
        let mut stem = base.clone();
        let mut n = 1;
        while !used.insert(stem.clone()) {
            n += 1;
            stem = format!("{base}-{n}");
        }
        let file = format!("{stem}.safetensors");
        let tensors: HashMap<String, Tensor> = [
            ("target_latents", &s.target_latents),
            ("attention_mask", &s.attention_mask),
            ("encoder_hidden_states", &s.encoder_hidden_states),
            ("encoder_attention_mask", &s.encoder_attention_mask),
            ("context_latents", &s.context_latents),
        ]
        .into_iter()
        .map(|(k, t)| Ok((k.to_string(), t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_>>()?;
        let path = dir.join(&file);
        let tmp = dir.join(format!(".{file}.tmp"));
        save_tensors(&tensors, &tmp)?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        manifest.samples.push(ManifestEntry { file, source: s.source.clone(), frames: s.target_latents.dim(0)? });
        written.push(path);
    }
    let path = dir.join(MANIFEST);
    let json = serde_json::to_string_pretty(&manifest)
        .map_err(|e| Error::BadFile { path: path.clone(), reason: e.to_string() })?;
    std::fs::write(&path, json).map_err(|e| Error::io(&path, e))?;
    Ok(written)
}

/// Whether `dir` holds preprocessed samples (ours or ACE-Step's) rather than audio.
pub fn is_preprocessed_dir(dir: &Path) -> bool {
    sample_files(dir).map(|f| !f.is_empty()).unwrap_or(false)
}

/// `dir`'s manifest, when it holds one of ours.
fn read_manifest(dir: &Path) -> Option<Manifest> {
    let bytes = super::regular::read_regular(&dir.join(MANIFEST)).ok()?;
    serde_json::from_slice::<Manifest>(&bytes).ok().filter(|m| m.format == FORMAT)
}

fn sample_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if let Some(m) = read_manifest(dir) {
        return Ok(m.samples.iter().map(|e| dir.join(&e.file)).collect());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("safetensors" | "pt")))
        .collect();
    files.sort();
    Ok(files)
}

/// What a run's model makes of a song, which the samples it trains on must match.
pub struct SampleMaker<'a> {
    pub encoder: &'a dyn LatentEncoder,
    pub conditioner: &'a dyn Conditioner,
    /// Width of the condition rows the DiT takes (`encoder_hidden_size`).
    pub condition_width: usize,
}

/// Reads every sample of `dir`: the manifest's list, else every `*.safetensors` and
/// `*.pt` file (ACE-Step's preprocessed tensors). Tensors come back f32 on the CPU.
/// Samples another model made are refused: our manifest's encoder and conditioner ids
/// must be `model`'s, and every sample's latent and condition widths its sizes.
pub fn read_preprocessed_dir(dir: &Path, model: &SampleMaker) -> Result<Vec<TrainingSample>> {
    check_manifest(dir, model)?;
    let files = sample_files(dir)?;
    if files.is_empty() {
        return Err(Error::BadFile {
            path: dir.to_path_buf(),
            reason: "no preprocessed samples (*.safetensors or *.pt)".into(),
        });
    }
    files.iter().map(|f| read_sample(f).and_then(|s| check_widths(&s, model).map(|()| s))).collect()
}

/// Our manifest's ids against the model's: a folder another model made would train on
/// latents and conditions this model does not make (or fail deep inside a step).
fn check_manifest(dir: &Path, model: &SampleMaker) -> Result<()> {
    let Some(manifest) = read_manifest(dir) else { return Ok(()) };
    let pairs = [
        ("latent encoder", manifest.encoder, model.encoder.id()),
        ("conditioner", manifest.conditioner, model.conditioner.id()),
    ];
    let differ: Vec<String> = pairs
        .into_iter()
        .filter(|(_, made, ours)| made != ours)
        .map(|(what, made, ours)| format!("its {what} is `{made}`, this run's model's is `{ours}`"))
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::BadFile {
        path: dir.to_path_buf(),
        reason: format!(
            "was preprocessed with another model: {}; preprocess the songs again with this run's model",
            differ.join("; ")
        ),
    })
}

/// A sample's latent channels and condition width against the model's (ACE-Step's own
/// `.pt` folders carry no manifest to compare).
fn check_widths(sample: &TrainingSample, model: &SampleMaker) -> Result<()> {
    let widths = [
        ("target_latents", sample.target_latents.dim(1)?, model.encoder.latent_channels(), "latent channels"),
        ("encoder_hidden_states", sample.encoder_hidden_states.dim(1)?, model.condition_width, "condition width"),
    ];
    for (key, found, expected, what) in widths {
        if found != expected {
            return Err(Error::ModelFile {
                path: sample.source.clone(),
                key: key.into(),
                reason: format!(
                    "{found} {what}, but this run's model has {expected}: the sample was made for another model"
                ),
            });
        }
    }
    Ok(())
}

/// One preprocessed sample file, shapes checked.
pub fn read_sample(path: &Path) -> Result<TrainingSample> {
    let bad = |key: &str, reason: String| Error::ModelFile { path: path.to_path_buf(), key: key.into(), reason };
    let mut tensors: HashMap<String, Tensor> = if path.extension().and_then(|e| e.to_str()) == Some("pt") {
        let v = read_pt(path)?;
        KEYS.iter().filter_map(|k| v.get(k).and_then(|x| x.as_tensor()).map(|t| (k.to_string(), t.clone()))).collect()
    } else {
        candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| Error::BadFile { path: path.to_path_buf(), reason: format!("cannot read safetensors: {e}") })?
    };
    let mut take = |k: &str| -> Result<Tensor> {
        let t = tensors.remove(k).ok_or_else(|| bad(k, "missing".into()))?;
        Ok(t.to_dtype(DType::F32)?)
    };
    let s = TrainingSample {
        source: path.to_path_buf(),
        target_latents: take("target_latents")?,
        attention_mask: take("attention_mask")?,
        encoder_hidden_states: take("encoder_hidden_states")?,
        encoder_attention_mask: take("encoder_attention_mask")?,
        context_latents: take("context_latents")?,
    };
    let shape = |k: &str, t: &Tensor, want: &[Option<usize>]| -> Result<()> {
        let ok = t.rank() == want.len() && t.dims().iter().zip(want).all(|(d, w)| w.is_none_or(|w| *d == w));
        if ok {
            Ok(())
        } else {
            Err(bad(k, format!("shape {:?}, expected {want:?}", t.dims())))
        }
    };
    let (frames, channels) = s
        .target_latents
        .dims2()
        .map_err(|_| bad("target_latents", format!("shape {:?}, expected [T, C]", s.target_latents.dims())))?;
    let rows = s.encoder_hidden_states.dim(0)?;
    shape("attention_mask", &s.attention_mask, &[Some(frames)])?;
    shape("encoder_hidden_states", &s.encoder_hidden_states, &[Some(rows), None])?;
    shape("encoder_attention_mask", &s.encoder_attention_mask, &[Some(rows)])?;
    shape("context_latents", &s.context_latents, &[Some(frames), Some(2 * channels)])?;
    Ok(s)
}

/// Encodes every usable song of `spec.folder` once (no crops drawn at random: the
/// centre crop, if any) and writes the folder `train` accepts in place of audio.
/// `out` may not be the song folder or inside it: the songs are only ever read.
pub fn preprocess(
    spec: &super::DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    out: &Path,
    report: &mut dyn FnMut(super::DataEvent),
) -> Result<Vec<PathBuf>> {
    let songs = std::fs::canonicalize(&spec.folder).map_err(|e| Error::io(&spec.folder, e))?;
    if resolved(out)?.starts_with(&songs) {
        return Err(Error::BadFile {
            path: out.to_path_buf(),
            reason: format!(
                "is inside the song folder {}, which is never written to: choose an output folder outside it",
                spec.folder.display()
            ),
        });
    }
    let tmp_cache = out.join(".cache");
    let cache = super::LatentCache::new(&tmp_cache)?;
    // Not cancellable: the CLI leaves Ctrl-C to its default (stop at once), and a
    // rerun reuses what the temporary cache holds.
    let data = super::prepare_dataset(spec, encoder, conditioner, Some(&cache), &Cancel::never(), report)?;
    // With crops, each song's centre window: a preprocessed sample is one fixed clip.
    let fps = encoder.frames_per_second();
    let samples: Vec<TrainingSample> = (data.items.iter().filter_map(|i| i.cached.as_ref()))
        .map(|s| data.window(s, fps, None))
        .collect::<Result<_>>()?;
    let written = write_preprocessed(out, &samples, &Manifest::new(encoder.id(), conditioner.id()));
    std::fs::remove_dir_all(&tmp_cache).map_err(|e| Error::io(&tmp_cache, e))?;
    written
}

/// `path` made absolute with its links and `..` resolved, as creating it would: each
/// existing prefix canonical, the rest (which holds no links yet) taken as written.
fn resolved(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let mut real = PathBuf::new();
    for part in absolute.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                real.pop();
            }
            part => real.push(part),
        }
        if let Ok(canonical) = std::fs::canonicalize(&real) {
            real = canonical;
        }
    }
    Ok(real)
}
