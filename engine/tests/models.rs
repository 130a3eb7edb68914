//! Finding, downloading and verifying ACE-Step models, against a hub on 127.0.0.1
//! (tests/hub_server) that serves the tiny real-layout model of tests/fixtures/real, and
//! the 5 Hz LMs (a tiny random LM folder in the real layout).

mod hub_server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};

use hub_server::{blob_id, FakeHub, Fault};
use ostinato_engine::cancel::Cancel;
use ostinato_engine::load::catalog::MAIN_REPO;
use ostinato_engine::load::folder::{ModelFolder, Variant};
use ostinato_engine::load::{
    find_lms, find_models, verify_lm, verify_model, AddedFolders, DitVariant, DownloadEvent, Downloadable, Downloader,
    Flavor, Hub, HubCache, LmFolder, LmVariant, ModelPlaces, ModelSize, Origin, Patience,
};
use ostinato_engine::model::DecoderWeights;
use ostinato_engine::tensor_io::{save_tensors, TensorFile};
use ostinato_engine::Error;

const COMMIT: &str = "4f1c0ffee4f1c0ffee4f1c0ffee4f1c0ffee4f1c";
const TURBO_WEIGHTS: &str = "acestep-v15-turbo/model.safetensors";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real/model")
}

/// The main repository as the hub lays it out, with a language model folder a run does
/// not need (and the download must leave alone).
fn main_repo(hub: &FakeHub) {
    hub.add_folder(MAIN_REPO, COMMIT, &fixture(), "");
    hub.add_repo_file(MAIN_REPO, "acestep-5Hz-lm-1.7B/model.safetensors", b"not needed".to_vec());
    hub.add_repo_file(MAIN_REPO, "README.md", b"# ACE-Step 1.5\n".to_vec());
}

/// The tests' hub answers at once, so waits are short; a retry comes after 5 ms.
fn quick() -> Patience {
    Patience {
        connect: Duration::from_secs(5),
        idle: Duration::from_secs(5),
        first_retry_after: Duration::from_millis(5),
        tries: 5,
    }
}

struct Setup {
    hub: FakeHub,
    client: Hub,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        Self::with(quick())
    }

    fn with(patience: Patience) -> Self {
        let hub = FakeHub::start();
        main_repo(&hub);
        let client = Hub::new(&hub.url, None, patience);
        Self { hub, client, dir: tempfile::tempdir().unwrap() }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("hub")
    }

    fn downloader(&self) -> Downloader<'_> {
        Downloader { hub: &self.client, cache: HubCache::new(self.cache()), models_dir: self.dir.path().join("models") }
    }

    fn download(&self, variant: impl Into<Downloadable>) -> (Result<PathBuf, Error>, Vec<DownloadEvent>) {
        let mut events = Vec::new();
        let r = self.downloader().download(variant, &mut |e| events.push(e), &Cancel::never());
        (r, events)
    }

    fn places(&self) -> ModelPlaces {
        ModelPlaces { downloads: self.dir.path().join("models"), hub_cache: Some(self.cache()), ..Default::default() }
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        HubCache::new(self.cache()).repo_dir(repo)
    }

    fn resolve_requests(&self, path: &str) -> Vec<Option<u64>> {
        self.hub
            .requests()
            .into_iter()
            .filter(|(p, _)| p.ends_with(path) && p.contains("/resolve/"))
            .map(|(_, r)| r)
            .collect()
    }
}

/// Every file of the fixture folder, relative.
fn fixture_files() -> Vec<String> {
    let mut out = Vec::new();
    for part in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        for f in std::fs::read_dir(fixture().join(part)).unwrap().flatten() {
            out.push(format!("{part}/{}", f.file_name().to_string_lossy()));
        }
    }
    out.sort();
    out
}

#[test]
fn turbo_downloads_into_the_hub_cache_and_is_then_found_complete() {
    let s = Setup::new();
    let (model, events) = s.download(DitVariant::Turbo);
    let model = model.unwrap();
    let repo = s.repo_dir(MAIN_REPO);
    let snapshot = repo.join("snapshots").join(COMMIT);
    assert_eq!(model, snapshot.join("acestep-v15-turbo"));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);

    // Every file a run needs, linked to a blob named by its hub id; nothing else fetched.
    let files = fixture_files();
    for f in &files {
        let link = snapshot.join(f);
        let data = std::fs::read(&link).unwrap();
        assert_eq!(data, std::fs::read(fixture().join(f)).unwrap(), "{f}");
        assert_eq!(
            std::fs::canonicalize(&link).unwrap(),
            std::fs::canonicalize(repo.join("blobs").join(blob_id(f, &data))).unwrap()
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{f} is a link into blobs/");
    }
    assert!(!snapshot.join("acestep-5Hz-lm-1.7B").exists() && !snapshot.join("README.md").exists());
    assert_eq!(std::fs::read_dir(repo.join("blobs")).unwrap().count(), files.len(), "no .incomplete left");

    // Events: the file list asked for, the plan, then per-file progress up to every
    // byte, then the model.
    assert_eq!(events[0], DownloadEvent::ListingFiles { repo: MAIN_REPO.into(), endpoint: s.hub.url.clone() });
    let total: u64 = files.iter().map(|f| std::fs::metadata(fixture().join(f)).unwrap().len()).sum();
    assert!(
        matches!(&events[1], DownloadEvent::Planned { files: n, bytes, missing_bytes, .. } if *n == files.len() && *bytes == total && *missing_bytes == total)
    );
    let last_progress = events.iter().rev().find_map(|e| match e {
        DownloadEvent::Progress { total_done, total, .. } => Some((*total_done, *total)),
        _ => None,
    });
    assert_eq!(last_progress, Some((total, total)));
    assert_eq!(events.iter().filter(|e| matches!(e, DownloadEvent::FileVerified { .. })).count(), files.len());
    assert_eq!(events.last(), Some(&DownloadEvent::Finished { model: model.clone() }));

    // Found by the model list, complete, and opened by ModelFolder.
    let found = find_models(&s.places());
    assert_eq!(found.len(), 1, "{found:?}");
    let m = &found[0];
    assert_eq!(
        (m.path.as_path(), m.variant, m.origin, m.complete),
        (model.as_path(), Flavor::Turbo, Origin::HubCache, true)
    );
    assert_eq!(m.bytes, total);
    assert_eq!(ModelFolder::open(&m.path, None).unwrap().variant(), Variant::Turbo);
    let v = verify_model(&m.path, &mut |_| {}).unwrap();
    assert_eq!((v.hashed, v.unhashed), (files.len(), 0));
    assert!(v.tensors > 0);

    // A second download finds everything in place and fetches nothing.
    let before = s.hub.requests().len();
    let (again, events) = s.download(DitVariant::Turbo);
    assert_eq!(again.unwrap(), model);
    assert!(matches!(events[1], DownloadEvent::Planned { missing_bytes: 0, .. }));
    assert!(s.hub.requests()[before..].iter().all(|(p, _)| p.starts_with("/api/")));

    // A weight changed on disk afterwards (the header still fits) fails `verify`, by name.
    let blob = std::fs::canonicalize(snapshot.join("vae/diffusion_pytorch_model.safetensors")).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let msg = verify_model(&model, &mut |_| {}).unwrap_err().to_string();
    assert!(msg.contains("vae/diffusion_pytorch_model.safetensors: sha256 mismatch"), "{msg}");
}

#[test]
fn a_dropped_connection_resumes_with_a_range_request() {
    let s = Setup::new();
    let size = s.hub.file(MAIN_REPO, TURBO_WEIGHTS).len();
    s.hub.fault(&format!("{MAIN_REPO}/{TURBO_WEIGHTS}"), Fault::DropAfter(size / 3));
    let (model, events) = s.download(DitVariant::Turbo);
    let model = model.unwrap();
    assert_eq!(s.resolve_requests(TURBO_WEIGHTS), [None, Some((size / 3) as u64)]);
    assert!(events
        .iter()
        .any(|e| matches!(e, DownloadEvent::Retrying { what, next_try: 2, .. } if what == TURBO_WEIGHTS)));
    assert!(events.iter().any(|e| matches!(e, DownloadEvent::FileStarted { path, from, .. } if path == TURBO_WEIGHTS && *from == (size / 3) as u64)));
    assert_eq!(std::fs::read(model.join("model.safetensors")).unwrap(), s.hub.file(MAIN_REPO, TURBO_WEIGHTS));
    verify_model(&model, &mut |_| {}).unwrap();
}

#[test]
fn a_quit_download_resumes_from_its_incomplete_blob() {
    let s = Setup::new();
    // Cancel once the DiT weights have started: the partial file stays for next time.
    let data = s.hub.file(MAIN_REPO, TURBO_WEIGHTS);
    s.hub.fault(&format!("{MAIN_REPO}/{TURBO_WEIGHTS}"), Fault::DropAfter(data.len() / 2));
    let cancel = Cancel::never();
    let mut events = Vec::new();
    let r = s.downloader().download(
        DitVariant::Turbo,
        &mut |e| {
            if matches!(&e, DownloadEvent::Retrying { .. }) {
                cancel.cancel();
            }
            events.push(e)
        },
        &cancel,
    );
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    let partial = s.repo_dir(MAIN_REPO).join("blobs").join(format!("{}.incomplete", blob_id(TURBO_WEIGHTS, &data)));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), (data.len() / 2) as u64);
    assert!(find_models(&s.places()).is_empty(), "nothing looks like a model yet");

    // The next run asks only for the rest: not the files verified before the quit, and
    // not the first half of the weights.
    let verified: u64 = events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::FileVerified { path } => Some(s.hub.file(MAIN_REPO, path).len() as u64),
            _ => None,
        })
        .sum();
    let (model, events) = s.download(DitVariant::Turbo);
    model.unwrap();
    let half = (data.len() / 2) as u64;
    assert!(
        matches!(events[1], DownloadEvent::Planned { missing_bytes, bytes, .. } if missing_bytes == bytes - verified - half)
    );
    assert_eq!(s.resolve_requests(TURBO_WEIGHTS).last(), Some(&Some(half)));
    assert!(!partial.exists());
    // Progress counts what this run fetched, up to exactly what it planned to.
    let planned = match events[1] {
        DownloadEvent::Planned { missing_bytes, .. } => missing_bytes,
        _ => unreachable!(),
    };
    let last = events.iter().rev().find_map(|e| match e {
        DownloadEvent::Progress { total_done, total, .. } => Some((*total_done, *total)),
        _ => None,
    });
    assert_eq!(last, Some((planned, planned)));
}

#[test]
fn corrupted_bytes_fail_the_checksum_and_leave_nothing_complete() {
    let s = Setup::new();
    let vae = "vae/diffusion_pytorch_model.safetensors";
    s.hub.fault(&format!("{MAIN_REPO}/{vae}"), Fault::Corrupt);
    let (r, _) = s.download(DitVariant::Turbo);
    let msg = r.unwrap_err().to_string();
    println!("{msg}");
    assert!(msg.contains(vae) && msg.contains("sha256 mismatch"), "{msg}");
    let repo = s.repo_dir(MAIN_REPO);
    let id = blob_id(vae, &s.hub.file(MAIN_REPO, vae));
    assert!(!repo.join("blobs").join(&id).exists() && !repo.join("blobs").join(format!("{id}.incomplete")).exists());
    assert!(
        !repo.join("snapshots").exists() && !repo.join("refs").exists(),
        "no snapshot before every file is verified"
    );
    assert!(find_models(&s.places()).is_empty());
}

#[test]
fn a_missing_file_or_repository_is_named() {
    let s = Setup::new();
    let tok = "Qwen3-Embedding-0.6B/tokenizer.json";
    s.hub.fault(&format!("{MAIN_REPO}/{tok}"), Fault::NotFound);
    let msg = s.download(DitVariant::Turbo).0.unwrap_err().to_string();
    assert!(msg.contains(MAIN_REPO) && msg.contains(tok) && msg.contains("404"), "{msg}");

    // base lives in a repository this hub does not have.
    let msg = s.download(DitVariant::Base).0.unwrap_err().to_string();
    assert!(msg.contains("ACE-Step/acestep-v15-base") && msg.contains("no such repository"), "{msg}");
}

#[test]
fn a_server_error_is_retried_then_succeeds() {
    let s = Setup::new();
    let cfg = "vae/config.json";
    s.hub.fault(&format!("{MAIN_REPO}/{cfg}"), Fault::ServerErrorOnce);
    let (model, events) = s.download(DitVariant::Turbo);
    model.unwrap();
    assert_eq!(s.resolve_requests(cfg).len(), 2);
    assert!(events
        .iter()
        .any(|e| matches!(e, DownloadEvent::Retrying { what, reason, .. } if what == cfg && reason.contains("500"))));
}

/// The retries a download said: (what, reason, next try, tries).
fn retries(events: &[DownloadEvent]) -> Vec<(String, String, u32, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::Retrying { what, reason, next_try, tries, .. } => {
                Some((what.clone(), reason.clone(), *next_try, *tries))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_unreachable_hub_fails_at_once_and_says_how_to_use_a_mirror() {
    // A port of 127.0.0.1 with nothing listening: every connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let client = Hub::new(&url, None, quick());
    let dir = tempfile::tempdir().unwrap();
    let d = Downloader {
        hub: &client,
        cache: HubCache::new(dir.path().join("hub")),
        models_dir: dir.path().join("models"),
    };
    let mut events = Vec::new();
    let msg = d.download(DitVariant::Turbo, &mut |e| events.push(e), &Cancel::never()).unwrap_err().to_string();
    println!("{msg}");
    assert!(msg.contains(&format!("cannot reach the hub at {url} (")) && msg.contains("refused"), "{msg}");
    assert!(msg.contains("set HF_ENDPOINT to the address of a mirror"), "{msg}");
    // Asked once: no retry, no wait.
    assert_eq!(events, [DownloadEvent::ListingFiles { repo: MAIN_REPO.into(), endpoint: url }]);
}

#[test]
fn a_hub_that_never_answers_times_out_and_says_each_retry() {
    let s = Setup::with(Patience { idle: Duration::from_millis(300), tries: 3, ..quick() });
    s.hub.fault_listing(MAIN_REPO, Fault::NeverAnswers);
    let (r, events) = s.download(DitVariant::Turbo);
    let msg = r.unwrap_err().to_string();
    println!("{msg}");
    let silent = "the hub sent nothing for 0.3 s";
    assert!(msg.contains(&format!("gave up after 3 tries: {silent}")), "{msg}");
    let list = format!("the file list of {MAIN_REPO}");
    assert_eq!(retries(&events), [(list.clone(), silent.into(), 2, 3), (list, silent.into(), 3, 3)]);
}

#[test]
fn a_file_list_dropped_once_is_retried_and_the_download_verified() {
    let s = Setup::new();
    s.hub.fault_listing(MAIN_REPO, Fault::HangUpOnce);
    let (model, events) = s.download(DitVariant::Turbo);
    let model = model.unwrap();
    let said = retries(&events);
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!((said[0].0.as_str(), said[0].2, said[0].3), (format!("the file list of {MAIN_REPO}").as_str(), 2, 5));
    assert_eq!(s.hub.requests().iter().filter(|(p, _)| p.starts_with("/api/")).count(), 2);
    assert_eq!(
        events.iter().filter(|e| matches!(e, DownloadEvent::FileVerified { .. })).count(),
        fixture_files().len()
    );
    verify_model(&model, &mut |_| {}).unwrap();
}

#[test]
fn a_stalled_file_times_out_and_resumes_where_it_stopped() {
    let s = Setup::with(Patience { idle: Duration::from_secs(1), ..quick() });
    let data = s.hub.file(MAIN_REPO, TURBO_WEIGHTS);
    s.hub.fault(&format!("{MAIN_REPO}/{TURBO_WEIGHTS}"), Fault::StallAfter(data.len() / 2));
    let (model, events) = s.download(DitVariant::Turbo);
    let model = model.unwrap();
    assert_eq!(retries(&events), [(TURBO_WEIGHTS.into(), "the hub sent nothing for 1 s".into(), 2, 5)]);
    assert_eq!(s.resolve_requests(TURBO_WEIGHTS), [None, Some((data.len() / 2) as u64)]);
    assert_eq!(std::fs::read(model.join("model.safetensors")).unwrap(), data);
    assert!(events.iter().any(|e| matches!(e, DownloadEvent::FileVerified { path } if path == TURBO_WEIGHTS)));
}

#[test]
fn a_gated_repository_needs_the_token() {
    let s = Setup::new();
    s.hub.fault(MAIN_REPO, Fault::Gated("hf_secret".into()));
    let msg = s.download(DitVariant::Turbo).0.unwrap_err().to_string();
    assert!(msg.contains("gated") && msg.contains("HF_TOKEN"), "{msg}");
    let client = Hub::new(&s.hub.url, Some("hf_secret".into()), quick());
    let d = Downloader { hub: &client, cache: HubCache::new(s.cache()), models_dir: s.dir.path().join("models") };
    d.download(DitVariant::Turbo, &mut |_| {}, &Cancel::never()).unwrap();
}

#[test]
fn a_download_that_does_not_fit_the_disk_does_not_start() {
    let s = Setup::new();
    s.hub.declare_size(MAIN_REPO, TURBO_WEIGHTS, 1 << 60);
    let msg = s.download(DitVariant::Turbo).0.unwrap_err().to_string();
    assert!(msg.contains("needs") && msg.contains("free"), "{msg}");
    assert!(s.resolve_requests("").is_empty(), "nothing fetched");
}

/// A DiT repository of its own (base, SFT, XL): the fixture's DiT folder at its root,
/// its config.json with `edits`.
fn own_dit_repo(edits: serde_json::Value) -> tempfile::TempDir {
    let dit = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture().join("acestep-v15-turbo")).unwrap().flatten() {
        std::fs::copy(f.path(), dit.path().join(f.file_name())).unwrap();
    }
    edit_config(&dit.path().join("config.json"), edits);
    dit
}

fn edit_config(cfg: &Path, edits: serde_json::Value) {
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(cfg).unwrap()).unwrap();
    for (k, v) in edits.as_object().unwrap() {
        match v {
            serde_json::Value::Null => json.as_object_mut().unwrap().remove(k),
            v => json.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    std::fs::write(cfg, json.to_string()).unwrap();
}

#[test]
fn base_is_put_together_from_its_own_repository_and_the_main_ones_parts() {
    let s = Setup::new();
    // ACE-Step/acestep-v15-base: the DiT folder at the repository's root.
    let dit = own_dit_repo(serde_json::json!({"model_version": "base", "is_turbo": false}));
    s.hub.add_folder("ACE-Step/acestep-v15-base", "b45e", dit.path(), "");

    let model = s.download(DitVariant::Base).0.unwrap();
    assert_eq!(model, s.dir.path().join("models/acestep-v15-base/acestep-v15-base"));
    assert_eq!(ModelFolder::open(&model, None).unwrap().variant(), Variant::Base);
    assert!(s.repo_dir("ACE-Step/acestep-v15-base").join("snapshots/b45e/model.safetensors").is_file());
    // The main repository gave only vae/ and the text encoder.
    assert!(!s.repo_dir(MAIN_REPO).join("snapshots").join(COMMIT).join("acestep-v15-turbo").exists());

    // Listed once (not again as the bare DiT snapshot in the cache), complete.
    let found = find_models(&s.places());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].variant, found[0].origin, found[0].complete), (Flavor::Base, Origin::Downloaded, true));
}

#[test]
fn xl_turbo_comes_from_its_own_repository_with_the_main_ones_vae_and_text_encoder() {
    let s = Setup::new();
    // ACE-Step/acestep-v15-xl-turbo: the DiT folder at the repository's root, its
    // weights in shards with their index as transformers writes them (the fixture's
    // tiny DiT: the catalog and the layout, not the XL shapes, are checked here).
    let dit = own_dit_repo(serde_json::json!({"model_version": "xl_turbo"}));
    shard(&dit.path().join("model.safetensors"));
    s.hub.add_folder("ACE-Step/acestep-v15-xl-turbo", "0c1a55", dit.path(), "");

    let (model, events) = s.download(DitVariant::XlTurbo);
    let model = model.unwrap();
    assert_eq!(model, s.dir.path().join("models/acestep-v15-xl-turbo/acestep-v15-xl-turbo"));
    let listed: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            DownloadEvent::ListingFiles { repo, .. } => Some(repo.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(listed, ["ACE-Step/acestep-v15-xl-turbo", MAIN_REPO]);

    // The plan, with every file's bytes, comes before any byte is fetched.
    let parts = ["vae", "Qwen3-Embedding-0.6B"].map(|p| fixture().join(p));
    let bytes_in = |dir: &Path| -> (usize, u64) {
        let files: Vec<u64> = std::fs::read_dir(dir).unwrap().flatten().map(|f| f.metadata().unwrap().len()).collect();
        (files.len(), files.iter().sum())
    };
    let (files, bytes) =
        [dit.path(), &parts[0], &parts[1]].into_iter().map(bytes_in).fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2));
    let planned = events.iter().position(|e| matches!(e, DownloadEvent::Planned { .. })).unwrap();
    assert_eq!(
        events[planned],
        DownloadEvent::Planned {
            variant: DitVariant::XlTurbo.into(),
            files,
            bytes,
            missing_bytes: bytes,
            cache: s.cache()
        }
    );
    assert!(!events[..planned].iter().any(|e| matches!(e, DownloadEvent::FileStarted { .. })));

    // The shards open as one file: checked, loaded, and the condition encoder's read.
    let folder = ModelFolder::open(&model, None).unwrap();
    assert_eq!((folder.kind.flavor, folder.variant()), (Flavor::Turbo, Variant::Turbo));
    assert_eq!(folder.dit_weights(), model.join("model.safetensors.index.json"));
    assert!(folder.check_weights().unwrap() > 0);
    let sharded = folder.load_decoder(DType::F32, &Device::Cpu).unwrap();
    let whole = DecoderWeights::load(&[&fixture().join(TURBO_WEIGHTS)], &folder.dit, DType::F32, &Device::Cpu).unwrap();
    let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(sharded.iter().count(), whole.iter().count());
    for (name, t) in sharded.iter() {
        assert_eq!(values(t), values(&whole.get(name).unwrap()), "{name}");
    }
    let keys = |file: &Path| {
        let mut keys = TensorFile::open(file, &Device::Cpu).unwrap().keys();
        keys.sort();
        keys
    };
    assert_eq!(keys(&folder.dit_weights()), keys(&fixture().join(TURBO_WEIGHTS)), "every tensor, the encoder's too");
    folder.conditioner(&Device::Cpu).unwrap();
    assert!(!s.repo_dir(MAIN_REPO).join("snapshots").join(COMMIT).join("acestep-v15-turbo").exists());
    let found = find_models(&s.places());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].variant, found[0].origin, found[0].complete), (Flavor::Turbo, Origin::Downloaded, true));
    // Its size class is its config's: the tiny DiT is neither 2B nor XL.
    assert_eq!(found[0].size, ModelSize::Other);
}

/// Splits a safetensors file in two shards and an index, as `save_pretrained` does, and
/// removes it.
fn shard(file: &Path) {
    let tensors = candle_core::safetensors::load(file, &Device::Cpu).unwrap();
    let mut keys: Vec<&String> = tensors.keys().collect();
    keys.sort();
    let names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let (first, second) = keys.split_at(keys.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (name, part) in names.iter().zip([first, second]) {
        let shard: HashMap<String, Tensor> = part.iter().map(|k| ((*k).clone(), tensors[*k].clone())).collect();
        save_tensors(&shard, &file.with_file_name(name)).unwrap();
        weight_map.extend(part.iter().map(|k| ((*k).clone(), serde_json::Value::from(*name))));
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(file.with_file_name("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::remove_file(file).unwrap();
}

#[test]
fn the_model_list_tells_2b_from_xl_by_the_config_not_the_folder_name() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("checkpoints");
    copy_dir(&fixture(), &ckpt);
    // An XL-shaped config in a folder named like the 2B turbo, and a 2B-shaped one in
    // a folder named like XL SFT (the tiny weights fit neither: both are incomplete).
    let xl = serde_json::json!({"hidden_size": 2560, "num_hidden_layers": 32, "layer_types": null});
    edit_config(&ckpt.join("acestep-v15-turbo/config.json"), xl);
    copy_dir(&fixture().join("acestep-v15-turbo"), &ckpt.join("acestep-v15-xl-sft"));
    let two_b = serde_json::json!({"hidden_size": 2048, "num_hidden_layers": 24, "layer_types": null,
        "model_version": "sft", "is_turbo": false});
    edit_config(&ckpt.join("acestep-v15-xl-sft/config.json"), two_b);

    let found = find_models(&ModelPlaces { checkpoints: vec![ckpt.clone()], ..Default::default() });
    let kinds: Vec<_> = found.iter().map(|m| (m.path.clone(), m.size, m.variant, m.complete)).collect();
    assert_eq!(
        kinds,
        [
            (ckpt.join("acestep-v15-turbo"), ModelSize::Xl, Flavor::Turbo, false),
            (ckpt.join("acestep-v15-xl-sft"), ModelSize::TwoB, Flavor::Sft, false),
        ]
    );
    assert_eq!(found[0].kind().label(), "XL turbo");
    assert!(!DitVariant::XlSft.matches(found[1].kind()) && DitVariant::Sft.matches(found[1].kind()));
    let json = serde_json::to_value(&found[1]).unwrap();
    assert_eq!((&json["size"], &json["variant"]), (&"2b".into(), &"sft".into()));
}

#[test]
fn checkpoints_and_added_folders_are_found_with_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    // An ACE-Step checkpoints folder: turbo complete, sft without its weights.
    let ckpt = dir.path().join("ACE-Step-1.5/checkpoints");
    copy_dir(&fixture(), &ckpt);
    copy_dir(&fixture().join("acestep-v15-turbo"), &ckpt.join("acestep-v15-sft"));
    std::fs::remove_file(ckpt.join("acestep-v15-sft/model.safetensors")).unwrap();
    let places = ModelPlaces { checkpoints: vec![ckpt.clone(), dir.path().join("nowhere")], ..Default::default() };
    let found = find_models(&places);
    assert_eq!(
        found.iter().map(|m| (m.path.clone(), m.complete)).collect::<Vec<_>>(),
        [(ckpt.join("acestep-v15-sft"), false), (ckpt.join("acestep-v15-turbo"), true)]
    );
    let sft = &found[0];
    assert_eq!((sft.variant, sft.origin), (Flavor::Turbo, Origin::Checkpoints), "the copied config says turbo");
    assert!(sft.problems.iter().any(|p| p.contains("acestep-v15-sft/model.safetensors")), "{:?}", sft.problems);

    // Added folders persist in models.json; a folder without a model is refused.
    let config = dir.path().join("config");
    let other = dir.path().join("elsewhere");
    copy_dir(&fixture(), &other);
    let added = AddedFolders::add(&config, &other).unwrap();
    assert_eq!(AddedFolders::load(&config).unwrap().folders, [added]);
    let err = AddedFolders::add(&config, dir.path()).unwrap_err().to_string();
    assert!(err.contains("no ACE-Step model"), "{err}");
    let places = ModelPlaces { added: AddedFolders::load(&config).unwrap().folders, ..Default::default() };
    let found = find_models(&places);
    assert_eq!((found.len(), found[0].origin, found[0].complete), (1, Origin::Added, true));
    assert!(AddedFolders::remove(&config, &other).unwrap());
    assert!(AddedFolders::load(&config).unwrap().folders.is_empty());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

// ---- The 5 Hz LMs (labelling): found and downloaded like the DiTs. ----

/// A tiny LM folder (the real layout, random weights) with the tokenizer files a real
/// one has beside tokenizer.json, in `dir`.
fn tiny_lm(dir: &Path) -> PathBuf {
    ostinato_engine::label::understand::tiny::write_tiny_lm(dir, 7).unwrap();
    for extra in ["vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja"] {
        std::fs::write(dir.join(extra), format!("{extra} of the tiny LM\n")).unwrap();
    }
    dir.to_path_buf()
}

/// Files of `dir`, relative, sorted.
fn files_of(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    out.sort();
    out
}

/// A hub whose main repository holds the DiT's parts and the 1.7B LM folder, and whose
/// 0.6B LM is a repository of its own, as on huggingface.co.
fn lm_setup() -> (Setup, PathBuf) {
    let hub = FakeHub::start();
    let dir = tempfile::tempdir().unwrap();
    let lm = tiny_lm(&dir.path().join("lm-source"));
    hub.add_folder(MAIN_REPO, COMMIT, &fixture(), "");
    hub.add_folder(MAIN_REPO, COMMIT, &lm, "acestep-5Hz-lm-1.7B/");
    hub.add_repo_file(MAIN_REPO, "README.md", b"# ACE-Step 1.5\n".to_vec());
    hub.add_folder("ACE-Step/acestep-5Hz-lm-0.6B", "0d06b0d06b0d06b0d06b0d06b0d06b0d06b0d06b", &lm, "");
    hub.add_repo_file("ACE-Step/acestep-5Hz-lm-0.6B", "README.md", b"# the 0.6B LM\n".to_vec());
    let client = Hub::new(&hub.url, None, quick());
    (Setup { hub, client, dir }, lm)
}

/// Qwen3's parameters at the tiny LM's sizes (tied embeddings: no lm_head), from its
/// config: what the header count must come to.
fn tiny_lm_parameters(lm: &Path) -> u64 {
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(lm.join("config.json")).unwrap()).unwrap();
    let n = |k: &str| c[k].as_u64().unwrap();
    let (h, hd, inter) = (n("hidden_size"), n("head_dim"), n("intermediate_size"));
    let (q, kv) = (n("num_attention_heads") * hd, n("num_key_value_heads") * hd);
    let layer = q * h + 2 * kv * h + h * q + 2 * hd + 3 * inter * h + 2 * h;
    let embeddings = if c["tie_word_embeddings"] == true { 1 } else { 2 }; // the LM head's own
    embeddings * n("vocab_size") * h + h + n("num_hidden_layers") * layer
}

#[test]
fn the_default_lm_downloads_its_one_folder_of_the_main_repository() {
    let (s, lm) = lm_setup();
    let (folder, events) = s.download(LmVariant::Lm1_7B);
    let folder = folder.unwrap();
    let snapshot = s.repo_dir(MAIN_REPO).join("snapshots").join(COMMIT);
    assert_eq!(folder, snapshot.join("acestep-5Hz-lm-1.7B"));
    // Every file of the folder, the extra tokenizer files too; nothing of the DiT's.
    assert_eq!(files_of(&folder), files_of(&lm));
    for f in files_of(&lm) {
        assert_eq!(std::fs::read(folder.join(&f)).unwrap(), std::fs::read(lm.join(&f)).unwrap(), "{f}");
    }
    assert_eq!(files_of(&snapshot), ["acestep-5Hz-lm-1.7B"], "only the LM's folder is fetched");

    // The plan names the LM as the command line does, and its bytes, before any file.
    let lm_bytes: u64 = files_of(&lm).iter().map(|f| std::fs::metadata(lm.join(f)).unwrap().len()).sum();
    let planned = events.iter().position(|e| matches!(e, DownloadEvent::Planned { .. })).unwrap();
    assert!(events[..planned].iter().all(|e| matches!(e, DownloadEvent::ListingFiles { .. })));
    let DownloadEvent::Planned { variant, files, bytes, missing_bytes, .. } = &events[planned] else { unreachable!() };
    assert_eq!(
        (*variant, *files, *bytes, *missing_bytes),
        (Downloadable::Lm(LmVariant::Lm1_7B), files_of(&lm).len(), lm_bytes, lm_bytes)
    );
    assert_eq!(serde_json::to_value(&events[planned]).unwrap()["variant"], "lm-1.7b");
    assert_eq!(events.last(), Some(&DownloadEvent::Finished { model: folder.clone() }));

    // It opens as an LM: the config's sizes and the headers' parameter count.
    let opened = LmFolder::open(&folder).unwrap();
    let tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = 256 + tokenizer["added_tokens"].as_array().unwrap().len();
    assert_eq!((opened.hidden_size, opened.layers, opened.vocab_size), (16, 1, vocab));
    println!("tiny LM: {} tensors, {} parameters", opened.tensors, opened.parameters);
    assert_eq!(opened.parameters, tiny_lm_parameters(&folder));
    assert_eq!(opened.variant(), Some(LmVariant::Lm1_7B));

    // Found in the hub cache, complete; no DiT is (none was downloaded).
    let found = find_lms(&s.places());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].name.as_str(), found[0].path.as_path(), found[0].origin, found[0].complete, found[0].bytes),
        ("lm-1.7b", folder.as_path(), Origin::HubCache, true, lm_bytes)
    );
    assert!(find_models(&s.places()).is_empty());
    let v = verify_lm(&folder, &mut |_| {}).unwrap();
    assert_eq!((v.hashed, v.unhashed, v.tensors), (files_of(&lm).len(), 0, opened.tensors));

    // Downloading the DiT next leaves the LM in place and the LM is still found.
    s.download(DitVariant::Turbo).0.unwrap();
    assert_eq!(find_models(&s.places()).len(), 1);
    assert_eq!(find_lms(&s.places()).len(), 1);
    let before = s.hub.requests().len();
    let (again, events) = s.download(LmVariant::Lm1_7B);
    assert_eq!(again.unwrap(), folder);
    assert!(matches!(events[1], DownloadEvent::Planned { missing_bytes: 0, .. }));
    assert!(s.hub.requests()[before..].iter().all(|(p, _)| p.starts_with("/api/")));
}

#[test]
fn an_lm_of_its_own_repository_is_its_snapshot() {
    let (s, lm) = lm_setup();
    let folder = s.download(LmVariant::Lm0_6B).0.unwrap();
    let repo = s.repo_dir("ACE-Step/acestep-5Hz-lm-0.6B");
    assert_eq!(folder, repo.join("snapshots/0d06b0d06b0d06b0d06b0d06b0d06b0d06b0d06b"));
    let mut expected = files_of(&lm);
    expected.push("README.md".into());
    expected.sort();
    assert_eq!(files_of(&folder), expected, "every file of the repository");
    assert!(!s.repo_dir(MAIN_REPO).exists(), "the main repository is not needed");
    let found = find_lms(&s.places());
    assert_eq!(
        found.iter().map(|l| (l.name.as_str(), l.path.as_path(), l.complete)).collect::<Vec<_>>(),
        [("lm-0.6b", folder.as_path(), true)]
    );
    // A repository the hub does not have is named.
    let msg = s.download(LmVariant::Lm4B).0.unwrap_err().to_string();
    assert!(msg.contains("ACE-Step/acestep-5Hz-lm-4B") && msg.contains("no such repository"), "{msg}");
}

#[test]
fn a_quit_lm_download_resumes_where_it_stopped() {
    let (s, _) = lm_setup();
    let weights = "acestep-5Hz-lm-1.7B/model.safetensors";
    let data = s.hub.file(MAIN_REPO, weights);
    s.hub.fault(&format!("{MAIN_REPO}/{weights}"), Fault::DropAfter(data.len() / 2));
    let cancel = Cancel::never();
    let r = s.downloader().download(
        LmVariant::Lm1_7B,
        &mut |e| {
            if matches!(&e, DownloadEvent::Retrying { .. }) {
                cancel.cancel();
            }
        },
        &cancel,
    );
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert!(find_lms(&s.places()).is_empty(), "no snapshot before every file is verified");
    let (folder, events) = s.download(LmVariant::Lm1_7B);
    let folder = folder.unwrap();
    assert_eq!(s.resolve_requests(weights).last(), Some(&Some((data.len() / 2) as u64)), "a Range request");
    assert!(events.iter().any(|e| matches!(e, DownloadEvent::FileStarted { path, from, .. } if path == weights && *from == (data.len() / 2) as u64)));
    assert_eq!(std::fs::read(folder.join("model.safetensors")).unwrap(), data);
    verify_lm(&folder, &mut |_| {}).unwrap();
}

#[test]
fn a_downloaded_folder_that_is_no_lm_fails_and_is_listed_with_its_problems() {
    let hub = FakeHub::start();
    let dir = tempfile::tempdir().unwrap();
    let lm = tiny_lm(&dir.path().join("lm-source"));
    std::fs::remove_file(lm.join("tokenizer_config.json")).unwrap();
    edit_config(&lm.join("config.json"), serde_json::json!({"architectures": ["Qwen3Model"]}));
    hub.add_folder("ACE-Step/acestep-5Hz-lm-0.6B", COMMIT, &lm, "");
    let s = Setup { client: Hub::new(&hub.url, None, quick()), hub, dir };
    let msg = s.download(LmVariant::Lm0_6B).0.unwrap_err().to_string();
    println!("{msg}");
    assert!(msg.contains("tokenizer_config.json: missing") && msg.contains("Qwen3ForCausalLM"), "{msg}");
    let found = find_lms(&s.places());
    assert_eq!((found.len(), found[0].name.as_str(), found[0].complete), (1, "lm-0.6b", false), "{found:?}");
    assert_eq!(found[0].problems.len(), 2, "{:?}", found[0].problems);
}

#[test]
fn broken_lm_folders_name_each_problem_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let lm = tiny_lm(&dir.path().join("acestep-5Hz-lm-1.7B"));
    let problems = |lm: &Path| match LmFolder::open(lm) {
        Err(Error::ModelFolder { problems, .. }) => problems,
        other => panic!("{other:?}"),
    };
    // No weights, no tokenizer.
    std::fs::rename(lm.join("model.safetensors"), dir.path().join("weights")).unwrap();
    std::fs::remove_file(lm.join("tokenizer.json")).unwrap();
    let p = problems(&lm);
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].contains("acestep-5Hz-lm-1.7B/tokenizer.json: missing"), "{p:?}");
    assert!(p[1].contains("acestep-5Hz-lm-1.7B/model.safetensors"), "{p:?}");

    // Shards: the index is followed, and a shard that is not there is named.
    std::fs::write(lm.join("tokenizer.json"), "{}").unwrap(); // only its presence is checked
    std::fs::rename(dir.path().join("weights"), lm.join("model-00001-of-00002.safetensors")).unwrap();
    let index = serde_json::json!({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors"}});
    std::fs::write(lm.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let p = problems(&lm);
    assert!(p.len() == 1 && p[0].contains("model-00002-of-00002.safetensors"), "{p:?}");
    let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}});
    std::fs::write(lm.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let opened = LmFolder::open(&lm).unwrap();
    assert_eq!(opened.parameters, tiny_lm_parameters(&lm), "every shard's tensors are counted");

    // A config that is no Qwen3 causal LM, or lacks a size.
    edit_config(&lm.join("config.json"), serde_json::json!({"model_type": "qwen2"}));
    let p = problems(&lm);
    assert!(p.len() == 1 && p[0].contains("config.json: architectures") && p[0].contains("\"qwen2\""), "{p:?}");
    edit_config(&lm.join("config.json"), serde_json::json!({"model_type": "qwen3", "num_hidden_layers": null}));
    let p = problems(&lm);
    assert!(p.len() == 1 && p[0].contains("`num_hidden_layers` is missing"), "{p:?}");
    edit_config(&lm.join("config.json"), serde_json::json!({"num_hidden_layers": 1, "vocab_size": 1000}));
    let p = problems(&lm);
    assert!(
        p.len() == 1 && p[0].contains("model.embed_tokens.weight has shape [65796, 16], config.json says [1000, 16]"),
        "{p:?}"
    );
    std::fs::write(lm.join("config.json"), "{").unwrap();
    assert!(problems(&lm)[0].contains("config.json: invalid JSON"));
    assert_eq!(problems(&dir.path().join("nowhere")), ["does not exist"]);
}

#[test]
fn lms_are_found_in_every_place_models_are() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // ACE-Step's checkpoints folder: its DiT parts and two LMs, one without weights.
    let ckpt = root.join("ACE-Step-1.5/checkpoints");
    copy_dir(&fixture(), &ckpt);
    tiny_lm(&ckpt.join("acestep-5Hz-lm-1.7B"));
    tiny_lm(&ckpt.join("acestep-5Hz-lm-4B"));
    std::fs::remove_file(ckpt.join("acestep-5Hz-lm-4B/model.safetensors")).unwrap();
    // The downloads folder, an added folder holding only an LM (a name of its own),
    // and a hub cache with the 0.6B's own repository.
    let downloads = root.join("models");
    tiny_lm(&downloads.join("acestep-5Hz-lm-0.6B"));
    let config = root.join("config");
    let mine = tiny_lm(&root.join("my-lm"));
    let added = AddedFolders::add(&config, &mine).unwrap();
    let cache = HubCache::new(root.join("hub"));
    let snapshot = cache.snapshot("ACE-Step/acestep-5Hz-lm-0.6B", COMMIT);
    tiny_lm(&snapshot);
    cache.set_ref("ACE-Step/acestep-5Hz-lm-0.6B", "main", COMMIT).unwrap();
    // Another Qwen3 causal LM in the hub cache is no 5 Hz LM.
    tiny_lm(&cache.snapshot("Qwen/Qwen3-0.6B", COMMIT));
    cache.set_ref("Qwen/Qwen3-0.6B", "main", COMMIT).unwrap();
    let places = ModelPlaces {
        downloads: downloads.clone(),
        hub_cache: Some(cache.root.clone()),
        // The same checkpoints folder twice: each LM listed once.
        checkpoints: vec![ckpt.clone(), ckpt.clone(), root.join("nowhere")],
        added: AddedFolders::load(&config).unwrap().folders,
    };
    let found = find_lms(&places);
    let listed: Vec<_> = found.iter().map(|l| (l.name.as_str(), l.path.clone(), l.origin, l.complete)).collect();
    assert_eq!(
        listed,
        [
            ("lm-0.6b", downloads.join("acestep-5Hz-lm-0.6B"), Origin::Downloaded, true),
            ("lm-0.6b", snapshot, Origin::HubCache, true),
            ("lm-1.7b", ckpt.join("acestep-5Hz-lm-1.7B"), Origin::Checkpoints, true),
            ("lm-4b", ckpt.join("acestep-5Hz-lm-4B"), Origin::Checkpoints, false),
            ("my-lm", added, Origin::Added, true),
        ]
    );
    assert!(found[3].problems.iter().any(|p| p.contains("acestep-5Hz-lm-4B/model.safetensors")), "{:?}", found[3]);
    assert!(found.iter().all(|l| l.bytes > 0));
    // The DiT beside them is still found, and the LMs are not taken for models.
    let models = find_models(&places);
    assert_eq!(models.iter().map(|m| m.path.clone()).collect::<Vec<_>>(), [ckpt.join("acestep-v15-turbo")]);
}
