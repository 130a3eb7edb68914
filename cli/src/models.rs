//! `models list | add | remove | download | verify`: the ACE-Step models (and the 5 Hz
//! LMs that label songs) on this machine, and getting one. The engine's `load` module
//! does the work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::load::download::gb;
use ostinato_engine::load::folder::hf_cache_dir;
use ostinato_engine::load::lm::is_lm_dir;
use ostinato_engine::load::patience::seconds;
use ostinato_engine::load::places::config_dir;
use ostinato_engine::load::{
    find_lms, find_models, verify_lm, verify_model, AddedFolders, DownloadEvent, Downloadable, Downloader, FoundLm,
    FoundModel, Hub, HubCache, LmVariant, ModelPlaces, Origin,
};
use ostinato_engine::Error;
use serde::Serialize;

use crate::train::{cancel_on_ctrl_c, INTERRUPTED};

#[derive(Subcommand)]
pub enum ModelsCommand {
    /// List the ACE-Step 1.5 models and 5 Hz LMs on this machine: the Hugging Face
    /// cache, ACE-Step's checkpoints folders and the folders you added. With --json, one
    /// array; each entry's `kind` is `dit` (a model to train) or `lm` (an LM to label with).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remember a folder that holds a model or an LM (a model folder, an LM folder, an
    /// ACE-Step checkpoints folder or a hub cache).
    Add { dir: PathBuf },
    /// Forget a folder added with `models add` (nothing is deleted).
    Remove { dir: PathBuf },
    /// Download a variant's DiT, VAE and text encoder, or a 5 Hz LM, into the Hugging
    /// Face cache (HF_HUB_CACHE / HF_HOME; hub from HF_ENDPOINT, token from HF_TOKEN).
    /// Run it again to resume an interrupted download.
    Download {
        #[arg(value_parser = parse_variant, help = variant_help())]
        variant: Downloadable,
        /// Print download events as JSON lines instead of a progress bar.
        #[arg(long)]
        json: bool,
    },
    /// Check a model: every file present, every tensor's header against its config,
    /// and every file in the hub cache against its checksum. Default: every model and
    /// LM found.
    Verify {
        /// A model folder or an LM folder, or a variant (turbo, base, sft, xl-turbo,
        /// xl-base, xl-sft, lm-0.6b, lm-1.7b, lm-4b) to check the ones found.
        target: Option<String>,
    },
}

/// The DiTs, then the LMs with their approximate sizes (the catalog's).
fn variant_help() -> String {
    let lms: Vec<String> = LmVariant::ALL.iter().map(|v| format!("{} ({})", v.name(), v.approx_size())).collect();
    format!(
        "turbo, base, sft (2B) or xl-turbo, xl-base, xl-sft (XL, 4B); or a 5 Hz LM for labelling: {} ({} is ACE-Step's default)",
        lms.join(", "),
        LmVariant::DEFAULT.name()
    )
}

fn parse_variant(s: &str) -> Result<Downloadable, String> {
    s.parse()
}

pub fn run(command: ModelsCommand) -> anyhow::Result<i32> {
    match command {
        ModelsCommand::List { json } => list(json).map(|_| 0),
        ModelsCommand::Add { dir } => {
            let added = AddedFolders::add(&config_dir(), &dir)?;
            println!("added {}", added.display());
            Ok(0)
        }
        ModelsCommand::Remove { dir } => {
            if !AddedFolders::remove(&config_dir(), &dir)? {
                bail!("{} is not among the added folders (see `ostinato models list`)", dir.display());
            }
            println!("removed {}", dir.display());
            Ok(0)
        }
        ModelsCommand::Download { variant, json } => download(variant, json),
        ModelsCommand::Verify { target } => verify(target.as_deref()),
    }
}

/// One entry of `list --json`: the found model or LM, tagged with what it is.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Listed<'a> {
    Dit(&'a FoundModel),
    Lm(&'a FoundLm),
}

fn list(json: bool) -> anyhow::Result<()> {
    let places = ModelPlaces::from_env()?;
    let models = find_models(&places);
    let lms = find_lms(&places);
    if json {
        let listed: Vec<Listed> = models.iter().map(Listed::Dit).chain(lms.iter().map(Listed::Lm)).collect();
        println!("{}", serde_json::to_string(&listed)?);
        return Ok(());
    }
    if models.is_empty() {
        println!("no ACE-Step 1.5 model found. Looked in:");
        for place in searched(&places) {
            println!("  {}", place.display());
        }
        println!(
            "download one with `ostinato models download turbo`, or add its folder with `ostinato models add DIR`"
        );
    } else {
        println!("{:<18} {:<11} {:>9}  {:<12} path", "model", "status", "on disk", "found in");
        for m in &models {
            row(&m.label, m.complete, m.bytes, m.origin, &m.path, &m.problems)?;
        }
    }
    if !lms.is_empty() {
        println!("\n{:<18} {:<11} {:>9}  {:<12} path", "5 Hz LM", "status", "on disk", "found in");
        for l in &lms {
            row(&l.name, l.complete, l.bytes, l.origin, &l.path, &l.problems)?;
        }
    }
    Ok(())
}

fn row(name: &str, complete: bool, bytes: u64, origin: Origin, path: &Path, problems: &[String]) -> anyhow::Result<()> {
    let status = if complete { "complete" } else { "incomplete" };
    let origin = serde_json::to_value(origin)?.as_str().unwrap_or_default().replace('_', " ");
    println!("{name:<18} {status:<11} {:>9}  {origin:<12} {}", gb(bytes), path.display());
    for p in problems {
        println!("    {p}");
    }
    Ok(())
}

fn searched(places: &ModelPlaces) -> Vec<PathBuf> {
    let mut all = vec![places.downloads.clone()];
    all.extend(places.hub_cache.clone());
    all.extend(places.checkpoints.iter().chain(&places.added).cloned());
    all
}

fn download(variant: Downloadable, json: bool) -> anyhow::Result<i32> {
    let cache = hf_cache_dir().context("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)")?;
    let hub = Hub::from_env();
    let downloader =
        Downloader { hub: &hub, cache: HubCache::new(cache), models_dir: ModelPlaces::from_env()?.downloads };
    let cancel = cancel_on_ctrl_c()?;
    let bar = if json { ProgressBar::hidden() } else { ProgressBar::new(0) };
    let mut show = |event: DownloadEvent| show(&bar, json, &event);
    match downloader.download(variant, &mut show, &cancel) {
        Ok(model) => {
            bar.finish_and_clear();
            if !json {
                println!("{model}", model = model.display());
                match variant {
                    Downloadable::Dit(_) => {
                        eprintln!("train with: ostinato train <AUDIO_DIR> --model {}", model.display())
                    }
                    Downloadable::Lm(_) => eprintln!("the 5 Hz LM folder, for labelling songs"),
                }
            }
            Ok(0)
        }
        Err(Error::Cancelled) => {
            bar.abandon();
            eprintln!("stopped; the partial file is kept: run the same command to resume");
            Ok(INTERRUPTED)
        }
        Err(e) => {
            bar.abandon();
            Err(e.into())
        }
    }
}

fn show(bar: &ProgressBar, json: bool, event: &DownloadEvent) {
    if json {
        println!("{}", serde_json::to_string(event).expect("events serialise"));
        return;
    }
    // `suspend` + eprintln rather than `println`, which a hidden bar (stderr not a
    // terminal) drops.
    let say = |line: String| bar.suspend(|| eprintln!("{line}"));
    match event {
        DownloadEvent::ListingFiles { repo, endpoint } => say(format!("asking {endpoint} for the files of {repo}")),
        DownloadEvent::Planned { variant, files, bytes, missing_bytes, cache } => {
            say(format!(
                "{}: {files} files, {} ({} to fetch) into {}",
                variant.name(),
                gb(*bytes),
                gb(*missing_bytes),
                cache.display()
            ));
            bar.set_length(*missing_bytes);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}")
                    .expect("valid template"),
            );
        }
        DownloadEvent::FileStarted { path, .. } => bar.set_message(path.clone()),
        DownloadEvent::Progress { total_done, .. } => bar.set_position(*total_done),
        DownloadEvent::Retrying { what, reason, next_try, tries, wait_ms } => {
            say(format!("{what}: {reason}; try {next_try} of {tries} in {}", seconds(Duration::from_millis(*wait_ms))))
        }
        DownloadEvent::FileVerified { .. } | DownloadEvent::Finished { .. } => {}
    }
}

/// A folder to verify, and whether it is an LM folder.
type Target = (PathBuf, bool);

fn verify(target: Option<&str>) -> anyhow::Result<i32> {
    let dirs: Vec<Target> = match target {
        Some(t) if Path::new(t).exists() => vec![(PathBuf::from(t), is_lm_dir(Path::new(t)))],
        Some(t) => {
            let variant: Downloadable = t.parse().map_err(|e: String| anyhow::anyhow!("{t} is no folder, and {e}"))?;
            let found: Vec<Target> = match variant {
                Downloadable::Dit(v) => find_models(&ModelPlaces::from_env()?)
                    .into_iter()
                    .filter(|m| v.matches(m.kind()))
                    .map(|m| (m.path, false))
                    .collect(),
                Downloadable::Lm(v) => find_lms(&ModelPlaces::from_env()?)
                    .into_iter()
                    .filter(|l| l.name == v.name())
                    .map(|l| (l.path, true))
                    .collect(),
            };
            if found.is_empty() {
                bail!(
                    "no {} model found (see `ostinato models list`; `ostinato models download {}` gets one)",
                    variant.name(),
                    variant.name()
                );
            }
            found
        }
        None => {
            let places = ModelPlaces::from_env()?;
            let models = find_models(&places).into_iter().map(|m| (m.path, false));
            models.chain(find_lms(&places).into_iter().map(|l| (l.path, true))).collect()
        }
    };
    if dirs.is_empty() {
        bail!("no ACE-Step 1.5 model found (see `ostinato models list`)");
    }
    let mut failed = 0;
    for (dir, is_lm) in dirs {
        let check = if is_lm { verify_lm } else { verify_model };
        match check(&dir, &mut |f| eprintln!("hashing {}", f.display())) {
            Ok(v) => println!(
                "ok {}: {} tensors fit their configs, {} files match their hub checksums{}",
                dir.display(),
                v.tensors,
                v.hashed,
                if v.unhashed > 0 {
                    format!(", {} files have no checksum to compare (not in a hub cache)", v.unhashed)
                } else {
                    String::new()
                }
            ),
            Err(e) => {
                failed += 1;
                println!("FAILED {}: {e}", dir.display());
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
