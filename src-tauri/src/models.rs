//! The model picker's backend: the ACE-Step models (and 5 Hz LMs) the engine finds on
//! this machine, the folders the user added, and one download at a time with progress
//! and cancel.
//! The engine's `load` module does the work; this forwards its events to the web view.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ostinato_engine::cancel::Cancel;
use ostinato_engine::load::{
    find_lms, find_models, AddedFolders, Downloadable, Downloader, FoundLm, FoundModel, Hub, HubCache, ModelPlaces,
};
use serde_json::{json, Value};

use crate::bridge::{engine_err, BridgeError, EventSink, Outgoing};

/// Where models are looked for and the download in progress.
pub struct Models {
    /// The system's places; the added folders are read from `config_dir` each time.
    places: ModelPlaces,
    config_dir: PathBuf,
    /// The cancel token of the download in progress.
    download: Arc<Mutex<Option<Cancel>>>,
}

impl Models {
    pub fn new(places: ModelPlaces, config_dir: PathBuf) -> Self {
        Self { places, config_dir, download: Arc::default() }
    }

    /// Every model found, with its variant, size and whether it is complete.
    pub fn list(&self) -> Result<Vec<FoundModel>, BridgeError> {
        Ok(find_models(&self.all_places()?))
    }

    /// Every 5 Hz LM found, with whether it is complete.
    pub fn list_lms(&self) -> Result<Vec<FoundLm>, BridgeError> {
        Ok(find_lms(&self.all_places()?))
    }

    /// The system's places and the folders added now.
    fn all_places(&self) -> Result<ModelPlaces, BridgeError> {
        let added = AddedFolders::load(&self.config_dir).map_err(engine_err)?.folders;
        Ok(ModelPlaces { added, ..self.places.clone() })
    }

    /// Remembers a folder that holds a model; the new list.
    pub fn add(&self, dir: &Path) -> Result<Vec<FoundModel>, BridgeError> {
        AddedFolders::add(&self.config_dir, dir).map_err(engine_err)?;
        self.list()
    }

    /// Forgets an added folder; the new list.
    pub fn remove(&self, dir: &Path) -> Result<Vec<FoundModel>, BridgeError> {
        if !AddedFolders::remove(&self.config_dir, dir).map_err(engine_err)? {
            return Err(BridgeError::Invalid(format!("{} was not added", dir.display())));
        }
        self.list()
    }

    pub fn downloading(&self) -> bool {
        self.slot().is_some()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Cancel>> {
        self.download.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts downloading `variant` (a DiT or an LM) into the hub cache on a thread of
    /// its own; its events go to `sink`. One download at a time.
    pub fn start_download(&self, variant: Downloadable, hub: Hub, sink: impl EventSink) -> Result<(), BridgeError> {
        let cache =
            self.places.hub_cache.clone().ok_or_else(|| {
                BridgeError::Invalid("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)".into())
            })?;
        let cancel = {
            let mut slot = self.slot();
            if slot.is_some() {
                return Err(BridgeError::Invalid("a download is in progress".into()));
            }
            slot.insert(Cancel::never()).clone()
        };
        let (models_dir, slot) = (self.places.downloads.clone(), self.download.clone());
        std::thread::Builder::new()
            .name("ostinato-download".into())
            .spawn(move || {
                let downloader = Downloader { hub: &hub, cache: HubCache::new(cache), models_dir };
                let mut forward = |e| sink.send(Outgoing::Download(&serde_json::to_value(&e).unwrap_or(Value::Null)));
                let end = downloader.download(variant, &mut forward, &cancel);
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
                match end {
                    Ok(_) => {}
                    Err(ostinato_engine::Error::Cancelled) => {
                        sink.send(Outgoing::Download(&json!({"type": "cancelled"})))
                    }
                    Err(e) => sink.send(Outgoing::Download(&json!({"type": "failed", "error": e.to_string()}))),
                }
            })
            .map_err(|e| BridgeError::Io { context: "starting the download".into(), source: e })?;
        Ok(())
    }

    /// Cancels the download in progress (its partial file stays for a resume); whether
    /// there was one.
    pub fn cancel_download(&self) -> bool {
        self.slot().as_ref().map(Cancel::cancel).is_some()
    }
}
