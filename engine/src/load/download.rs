//! Downloads an ACE-Step 1.5 variant (a DiT with its VAE and text encoder, or a 5 Hz
//! LM) into the Hugging Face cache, so other tools reuse it: every file is fetched into
//! `blobs/<id>.incomplete` (resumed with an HTTP Range after a dropped connection or a
//! quit), checked against the hub's sha256 (LFS) or git sha1, and only then renamed to
//! `blobs/<id>` and linked from `snapshots/<commit>/`. A file that fails its check is
//! deleted and named. Nothing looks complete unless it was verified.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::catalog::{DitVariant, Downloadable, Part, REVISION};
use super::folder::ModelFolder;
use super::hub::{denied_reason, Hub, HubCache, NetFailure, RemoteFile, Reply};
use super::lm::LmFolder;
use super::patience::{wait, Retries, Retry};
use crate::cancel::Cancel;
use crate::{Error, Result};

/// Progress is reported at most once per this many bytes of a file (and at its end).
const PROGRESS_EVERY: u64 = 1 << 20;

/// What a download reports, in order. Serialised for `--json` and the app.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DownloadEvent {
    /// The file list of `repo` is asked of the hub at `endpoint`.
    ListingFiles { repo: String, endpoint: String },
    /// Every file of the variant, their bytes, and the bytes still to fetch.
    Planned { variant: Downloadable, files: usize, bytes: u64, missing_bytes: u64, cache: PathBuf },
    /// A file starts, or resumes at byte `from`.
    FileStarted { repo: String, path: String, size: u64, from: u64 },
    /// Bytes of this file, and of everything this download fetches.
    Progress { path: String, done: u64, size: u64, total_done: u64, total: u64 },
    /// A request for `what` (a file's path, or `the file list of <repo>`) failed for
    /// `reason`; try `next_try` of `tries` starts in `wait_ms`, from where it stopped.
    Retrying { what: String, reason: String, next_try: u32, tries: u32, wait_ms: u64 },
    /// The file matched the hub's checksum and is in the cache.
    FileVerified { path: String },
    /// The model folder is complete and opens: train with `--model <model>` (a DiT),
    /// or label with it (an LM folder).
    Finished { model: PathBuf },
}

impl DownloadEvent {
    fn retrying(what: &str, retry: Retry, reason: String) -> Self {
        DownloadEvent::Retrying {
            what: what.to_string(),
            reason,
            next_try: retry.next_try,
            tries: retry.tries,
            wait_ms: retry.wait.as_millis() as u64,
        }
    }
}

/// A file to have in the cache.
struct Job<'a> {
    repo: &'static str,
    commit: &'a str,
    file: &'a RemoteFile,
}

/// Downloads variants into one hub cache.
pub struct Downloader<'a> {
    pub hub: &'a Hub,
    pub cache: HubCache,
    /// Where a model whose parts come from several repositories (base, SFT) is put
    /// together as ACE-Step's folder layout, of links into the cache.
    pub models_dir: PathBuf,
}

impl Downloader<'_> {
    /// Fetches what `what` still lacks and returns its DiT folder (a model folder
    /// `ModelFolder::open` accepts) or its LM folder (`LmFolder::open` accepts).
    /// Cancelling keeps the partial file for a resume.
    pub fn download(
        &self,
        what: impl Into<Downloadable>,
        on_event: &mut dyn FnMut(DownloadEvent),
        cancel: &Cancel,
    ) -> Result<PathBuf> {
        let what = what.into();
        let parts = what.parts();
        let mut listings = BTreeMap::new();
        for part in &parts {
            if !listings.contains_key(part.repo) {
                on_event(DownloadEvent::ListingFiles { repo: part.repo.into(), endpoint: self.hub.endpoint().into() });
                let what = format!("the file list of {}", part.repo);
                let mut on_retry = |retry, reason| on_event(DownloadEvent::retrying(&what, retry, reason));
                listings.insert(part.repo, self.hub.listing(part.repo, REVISION, &mut on_retry, cancel)?);
            }
        }
        let mut jobs = Vec::new();
        for part in &parts {
            let listing = &listings[part.repo];
            let before = jobs.len();
            jobs.extend(listing.files.iter().filter(|f| part.holds(&f.path)).map(|file| Job {
                repo: part.repo,
                commit: &listing.commit,
                file,
            }));
            if jobs.len() == before {
                return Err(Error::download(
                    format!("{}/{}", part.repo, part.prefix),
                    format!("the repository has no such folder at `{REVISION}` ({})", listing.commit),
                ));
            }
        }

        // What is missing, and whether it fits.
        std::fs::create_dir_all(&self.cache.root).map_err(|e| Error::io(&self.cache.root, e))?;
        let missing: Vec<&Job> = jobs.iter().filter(|j| !self.cache.blob(j.repo, &j.file.id).is_file()).collect();
        let missing_bytes: u64 = missing.iter().map(|j| j.file.size.saturating_sub(self.partial_len(j))).sum();
        on_event(DownloadEvent::Planned {
            variant: what,
            files: jobs.len(),
            bytes: jobs.iter().map(|j| j.file.size).sum(),
            missing_bytes,
            cache: self.cache.root.clone(),
        });
        check_free_space(&self.cache.root, missing_bytes)?;

        let mut total = Total { done: 0, of: missing_bytes };
        for job in missing {
            cancel.check()?;
            self.fetch(job, &mut total, on_event, cancel)?;
        }
        for job in &jobs {
            self.cache.link(job.repo, job.commit, &job.file.path, &job.file.id)?;
        }
        for (repo, listing) in &listings {
            self.cache.set_ref(repo, REVISION, &listing.commit)?;
        }

        let folder = match what {
            Downloadable::Dit(variant) => {
                let dit_dir = self.model_root(variant, &parts, &listings)?.join(variant.dit_folder());
                ModelFolder::open(&dit_dir, None)?;
                dit_dir
            }
            Downloadable::Lm(_) => {
                let lm = &parts[0];
                let snapshot = self.cache.snapshot(lm.repo, &listings[lm.repo].commit);
                // An LM's own repository is the LM folder.
                let lm_dir = match lm.prefix.trim_end_matches('/') {
                    "" => snapshot,
                    folder => snapshot.join(folder),
                };
                LmFolder::open(&lm_dir)?;
                lm_dir
            }
        };
        on_event(DownloadEvent::Finished { model: folder.clone() });
        Ok(folder)
    }

    fn partial_path(&self, job: &Job) -> PathBuf {
        let blob = self.cache.blob(job.repo, &job.file.id);
        blob.with_file_name(format!("{}.incomplete", job.file.id.name()))
    }

    fn partial_len(&self, job: &Job) -> u64 {
        std::fs::metadata(self.partial_path(job)).map(|m| m.len()).unwrap_or(0)
    }

    /// Fetches one file into its `.incomplete` blob (resuming what is there), checks
    /// it, and renames it into place.
    fn fetch(
        &self,
        job: &Job,
        total: &mut Total,
        on_event: &mut dyn FnMut(DownloadEvent),
        cancel: &Cancel,
    ) -> Result<()> {
        let (file, what) = (job.file, format!("{}: {}", job.repo, job.file.path));
        let partial = self.partial_path(job);
        let folder = partial.parent().expect("a blob has a folder");
        std::fs::create_dir_all(folder).map_err(|e| Error::io(folder, e))?;
        let url = self.hub.file_url(job.repo, job.commit, &file.path);
        let mut retries = Retries::new(self.hub.patience());
        let mut have = self.partial_len(job).min(file.size);
        loop {
            if have == file.size {
                break;
            }
            on_event(DownloadEvent::FileStarted {
                repo: job.repo.into(),
                path: file.path.clone(),
                size: file.size,
                from: have,
            });
            let before = have;
            let reason = match self.hub.get(&url, have) {
                Reply::Ok(resp) => {
                    // 206 continues the partial file; a 200 (Range ignored) starts over.
                    let resumed = resp.status().as_u16() == 206 && starts_at(&resp, have);
                    if !resumed {
                        // The bytes kept are fetched again.
                        total.of += have;
                        have = 0;
                    }
                    let mut out = open_partial(&partial, resumed)?;
                    let mut body = resp.into_body().into_reader();
                    let copied = copy_body(&mut body, &mut out, &mut have, file, total, on_event, cancel);
                    out.sync_all().map_err(|e| Error::io(&partial, e))?;
                    match copied {
                        Ok(()) if have == file.size => continue,
                        Ok(()) => format!("the connection closed at byte {have} of {}", file.size),
                        Err(Failure::Network(e)) => match self.hub.failure(e.into()) {
                            NetFailure::Transient(reason) => reason,
                            NetFailure::Unreachable(reason) => {
                                return Err(Error::download(what, format!("{reason}; {}", kept(have, file.size))))
                            }
                        },
                        Err(Failure::Fatal(e)) => {
                            if !matches!(e, Error::Cancelled) {
                                let _ = std::fs::remove_file(&partial);
                            }
                            return Err(e);
                        }
                    }
                }
                Reply::NotFound => return Err(Error::download(what, format!("HTTP 404: not found at {url}"))),
                Reply::Denied(s) => return Err(Error::download(what, denied_reason(s, self.hub.has_token()))),
                Reply::Unexpected(s) => return Err(Error::download(what, format!("unexpected HTTP {s} from {url}"))),
                Reply::Unreachable(reason) => {
                    return Err(Error::download(what, format!("{reason}; {}", kept(have, file.size))))
                }
                Reply::Transient(reason) => reason,
            };
            // A bounded retry: the patience's tries in a row without a new byte.
            if have > before {
                retries.progressed();
            }
            let Some(retry) = retries.failed() else {
                let tries = retries.tries();
                let kept = kept(have, file.size);
                return Err(Error::download(
                    what,
                    format!("gave up after {tries} tries without progress ({reason}); {kept}"),
                ));
            };
            on_event(DownloadEvent::retrying(&file.path, retry, reason));
            wait(retry.wait, cancel)?;
        }
        if let Err(why) = file.id.check_file(&partial)? {
            let _ = std::fs::remove_file(&partial);
            return Err(Error::download(what, format!("{why}; the download was deleted: run it again")));
        }
        let blob = self.cache.blob(job.repo, &file.id);
        std::fs::rename(&partial, &blob).map_err(|e| Error::io(&blob, e))?;
        on_event(DownloadEvent::FileVerified { path: file.path.clone() });
        Ok(())
    }

    /// The model folder of the downloaded parts: the snapshot itself when it already
    /// has ACE-Step's layout (turbo), else a folder of links to each part.
    fn model_root(
        &self,
        variant: DitVariant,
        parts: &[Part],
        listings: &BTreeMap<&str, super::hub::RepoListing>,
    ) -> Result<PathBuf> {
        let dirs: Vec<(&str, PathBuf)> = parts
            .iter()
            .map(|p| {
                (p.folder, self.cache.snapshot(p.repo, &listings[p.repo].commit).join(p.prefix.trim_end_matches('/')))
            })
            .collect();
        let shared = dirs[0].1.parent().map(Path::to_path_buf);
        if dirs.iter().all(|(name, dir)| dir.parent() == shared.as_deref() && dir.file_name() == Some(name.as_ref())) {
            return Ok(shared.expect("a snapshot folder has a parent"));
        }
        let root = self.models_dir.join(variant.dit_folder());
        let tmp = self.models_dir.join(format!(".{}.tmp", variant.dit_folder()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        for (name, dir) in &dirs {
            let at = tmp.join(name);
            link_dir(dir, &at).map_err(|e| Error::io(&at, e))?;
        }
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        }
        std::fs::rename(&tmp, &root).map_err(|e| Error::io(&root, e))?;
        Ok(root)
    }
}

/// Bytes fetched by this download so far, of the bytes it set out to fetch.
struct Total {
    done: u64,
    of: u64,
}

/// What a download that stopped leaves for the next.
fn kept(have: u64, size: u64) -> String {
    format!("{have} of {size} bytes are kept: run the download again to resume")
}

enum Failure {
    /// The connection failed: worth a retry from where it stopped (unless unreachable).
    Network(std::io::Error),
    /// The disk, a cancel, or a server that sent more than the file holds.
    Fatal(Error),
}

fn starts_at(resp: &ureq::http::Response<ureq::Body>, from: u64) -> bool {
    resp.headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(&format!("bytes {from}-")))
}

fn open_partial(path: &Path, append: bool) -> Result<File> {
    let mut opts = OpenOptions::new();
    if append {
        opts.append(true);
    } else {
        opts.write(true).create(true).truncate(true);
    }
    opts.open(path).map_err(|e| Error::io(path, e))
}

fn copy_body(
    body: &mut impl Read,
    out: &mut File,
    have: &mut u64,
    file: &RemoteFile,
    total: &mut Total,
    on_event: &mut dyn FnMut(DownloadEvent),
    cancel: &Cancel,
) -> std::result::Result<(), Failure> {
    let mut buf = vec![0u8; 1 << 16];
    let mut reported = *have;
    loop {
        cancel.check().map_err(Failure::Fatal)?;
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n as u64,
            Err(e) => return Err(Failure::Network(e)),
        };
        if *have + n > file.size {
            return Err(Failure::Fatal(Error::download(
                &file.path,
                format!("the server sent more than the hub's {} bytes", file.size),
            )));
        }
        out.write_all(&buf[..n as usize]).map_err(|e| Failure::Fatal(Error::io(&file.path, e)))?;
        *have += n;
        total.done += n;
        if *have - reported >= PROGRESS_EVERY || *have == file.size {
            reported = *have;
            on_event(DownloadEvent::Progress {
                path: file.path.clone(),
                done: *have,
                size: file.size,
                total_done: total.done,
                total: total.of,
            });
        }
    }
    Ok(())
}

/// Refuses to start when the cache's disk has less room than the download needs.
fn check_free_space(dir: &Path, needed: u64) -> Result<()> {
    let free = fs4::available_space(dir).map_err(|e| Error::io(dir, e))?;
    if free < needed {
        return Err(Error::download(
            dir.display().to_string(),
            format!("the download needs {} free and the disk has {}", gb(needed), gb(free)),
        ));
    }
    Ok(())
}

pub fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

fn link_dir(target: &Path, at: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::symlink(target, at);
    #[cfg(windows)]
    return std::os::windows::fs::symlink_dir(target, at);
    #[cfg(not(any(unix, windows)))]
    return Err(std::io::ErrorKind::Unsupported.into());
}
