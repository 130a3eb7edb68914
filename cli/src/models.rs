//! `models list | add | remove | download | verify`: the ACE-Step models on this
//! machine, and getting one. The engine's `load` module does the work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::cancel::Cancel;
use ostinato_engine::load::download::gb;
use ostinato_engine::load::folder::hf_cache_dir;
use ostinato_engine::load::patience::seconds;
use ostinato_engine::load::places::config_dir;
use ostinato_engine::load::{
    find_models, verify_model, AddedFolders, DitVariant, DownloadEvent, Downloader, FoundModel, Hub, HubCache,
    ModelPlaces,
};
use ostinato_engine::Error;

use crate::train::INTERRUPTED;

#[derive(Subcommand)]
pub enum ModelsCommand {
    /// List the ACE-Step 1.5 models on this machine: the Hugging Face cache, ACE-Step's
    /// checkpoints folders and the folders you added.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remember a folder that holds a model (a model folder, an ACE-Step checkpoints
    /// folder or a hub cache).
    Add { dir: PathBuf },
    /// Forget a folder added with `models add` (nothing is deleted).
    Remove { dir: PathBuf },
    /// Download a variant's DiT, VAE and text encoder into the Hugging Face cache
    /// (HF_HUB_CACHE / HF_HOME; hub from HF_ENDPOINT, token from HF_TOKEN). Run it again
    /// to resume an interrupted download.
    Download {
        /// turbo, base, sft (2B) or xl-turbo, xl-base, xl-sft (XL, 4B).
        #[arg(value_parser = parse_variant)]
        variant: DitVariant,
        /// Print download events as JSON lines instead of a progress bar.
        #[arg(long)]
        json: bool,
    },
    /// Check a model: every file present, every tensor's header against its config,
    /// and every file in the hub cache against its checksum. Default: every model found.
    Verify {
        /// A model folder, or a variant (turbo, base, sft, xl-turbo, xl-base, xl-sft) to
        /// check the ones found.
        target: Option<String>,
    },
}

fn parse_variant(s: &str) -> Result<DitVariant, String> {
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

fn list(json: bool) -> anyhow::Result<()> {
    let places = ModelPlaces::from_env()?;
    let models = find_models(&places);
    if json {
        println!("{}", serde_json::to_string(&models)?);
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
        return Ok(());
    }
    println!("{:<18} {:<11} {:>9}  {:<12} path", "model", "status", "on disk", "found in");
    for m in &models {
        let status = if m.complete { "complete" } else { "incomplete" };
        let origin = serde_json::to_value(m.origin)?.as_str().unwrap_or_default().replace('_', " ");
        println!("{:<18} {status:<11} {:>9}  {origin:<12} {}", m.label, gb(m.bytes), m.path.display());
        for p in &m.problems {
            println!("    {p}");
        }
    }
    Ok(())
}

fn searched(places: &ModelPlaces) -> Vec<PathBuf> {
    let mut all = vec![places.downloads.clone()];
    all.extend(places.hub_cache.clone());
    all.extend(places.checkpoints.iter().chain(&places.added).cloned());
    all
}

fn download(variant: DitVariant, json: bool) -> anyhow::Result<i32> {
    let cache = hf_cache_dir().context("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)")?;
    let hub = Hub::from_env();
    let downloader =
        Downloader { hub: &hub, cache: HubCache::new(cache), models_dir: ModelPlaces::from_env()?.downloads };
    let cancel = Cancel::never();
    {
        let cancel = cancel.clone();
        ctrlc::set_handler(move || {
            if cancel.is_cancelled() {
                std::process::exit(INTERRUPTED);
            }
            cancel.cancel();
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let bar = if json { ProgressBar::hidden() } else { ProgressBar::new(0) };
    let mut show = |event: DownloadEvent| show(&bar, json, &event);
    match downloader.download(variant, &mut show, &cancel) {
        Ok(model) => {
            bar.finish_and_clear();
            if !json {
                println!("{model}", model = model.display());
                eprintln!("train with: ostinato train <AUDIO_DIR> --model {}", model.display());
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

fn verify(target: Option<&str>) -> anyhow::Result<i32> {
    let dirs: Vec<PathBuf> = match target {
        Some(t) if Path::new(t).exists() => vec![PathBuf::from(t)],
        Some(t) => {
            let variant: DitVariant = t.parse().map_err(|e: String| anyhow::anyhow!("{t} is no folder, and {e}"))?;
            let found: Vec<FoundModel> =
                find_models(&ModelPlaces::from_env()?).into_iter().filter(|m| variant.matches(m.kind())).collect();
            if found.is_empty() {
                bail!(
                    "no {} model found (see `ostinato models list`; `ostinato models download {}` gets one)",
                    variant.name(),
                    variant.name()
                );
            }
            found.into_iter().map(|m| m.path).collect()
        }
        None => find_models(&ModelPlaces::from_env()?).into_iter().map(|m| m.path).collect(),
    };
    if dirs.is_empty() {
        bail!("no ACE-Step 1.5 model found (see `ostinato models list`)");
    }
    let mut failed = 0;
    for dir in dirs {
        match verify_model(&dir, &mut |f| eprintln!("hashing {}", f.display())) {
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
