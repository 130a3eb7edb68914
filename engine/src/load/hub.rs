//! The Hugging Face hub: its HTTP API (endpoint from `HF_ENDPOINT`, token from
//! `HF_TOKEN` or the token file), the ids it names files by, and its cache layout,
//! which `huggingface_hub`, `transformers` and `diffusers` read too:
//!
//! ```text
//! <cache>/models--<org>--<name>/blobs/<sha256 or git sha1>      the bytes, verified
//! <cache>/models--<org>--<name>/blobs/<id>.incomplete           a download in progress
//! <cache>/models--<org>--<name>/snapshots/<commit>/<path>       -> ../../blobs/<id>
//! <cache>/models--<org>--<name>/refs/main                       the commit of `main`
//! ```

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha1::Digest;

use super::patience::{seconds, wait, Patience, Retries, Retry};
use crate::cancel::Cancel;
use crate::{Error, Result};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How the hub names a file's content: LFS files by the sha256 of their bytes, small
/// files by their git blob id (sha1 of `blob <len>\0` + bytes). The cache names blobs
/// the same way, so a blob's name is also its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobId {
    Sha256(String),
    GitSha1(String),
}

impl BlobId {
    /// The blob's file name in the cache.
    pub fn name(&self) -> &str {
        match self {
            BlobId::Sha256(h) | BlobId::GitSha1(h) => h,
        }
    }

    /// From a cache blob's file name: 64 hex digits are a sha256, 40 a git sha1.
    pub fn from_name(name: &str) -> Option<Self> {
        if !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        match name.len() {
            64 => Some(BlobId::Sha256(name.to_ascii_lowercase())),
            40 => Some(BlobId::GitSha1(name.to_ascii_lowercase())),
            _ => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            BlobId::Sha256(_) => "sha256",
            BlobId::GitSha1(_) => "git sha1",
        }
    }

    /// Hashes `path` the same way; `Err` says which checksum differs and both values.
    pub fn check_file(&self, path: &Path) -> Result<std::result::Result<(), String>> {
        let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let found = match self {
            BlobId::Sha256(_) => hash_reader::<sha2::Sha256>(&mut file, None),
            BlobId::GitSha1(_) => {
                let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
                hash_reader::<sha1::Sha1>(&mut file, Some(format!("blob {len}\0").as_bytes()))
            }
        }
        .map_err(|e| Error::io(path, e))?;
        Ok(if found == self.name() {
            Ok(())
        } else {
            Err(format!("{} mismatch: the hub says {}, the file has {found}", self.kind(), self.name()))
        })
    }
}

fn hash_reader<D: Digest>(r: &mut impl Read, header: Option<&[u8]>) -> std::io::Result<String> {
    let mut hasher = D::new();
    if let Some(h) = header {
        hasher.update(h);
    }
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut buf)? {
            0 => break,
            n => hasher.update(&buf[..n]),
        }
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A file of a repository at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    pub id: BlobId,
}

/// A repository at a revision: the commit it resolved to and every file in it.
#[derive(Debug, Clone)]
pub struct RepoListing {
    pub repo: String,
    pub commit: String,
    pub files: Vec<RemoteFile>,
}

/// `GET /api/models/{repo}/revision/{rev}?blobs=true`, the fields used.
#[derive(Deserialize)]
struct ApiRevision {
    sha: String,
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: String,
    size: u64,
}

/// The hub's HTTP side: one agent (connections reused), the endpoint, the token, and
/// how long requests wait and are retried.
#[derive(Clone)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
    patience: Patience,
}

/// What a request came back as.
pub enum Reply {
    Ok(ureq::http::Response<ureq::Body>),
    /// 404: no such repository, revision or file.
    NotFound,
    /// 401/403: a gated or private repository without (a good) token.
    Denied(u16),
    /// Nothing answers at the endpoint's address (refused, no route, a name that does
    /// not resolve): offline, or the hub is blocked here. Not retried: the reason says
    /// what to do.
    Unreachable(String),
    /// A server error, a rate limit, a timeout or a dropped connection: worth another try.
    Transient(String),
    /// Anything else the hub should not answer.
    Unexpected(u16),
}

/// Why a request or a body read got no bytes, in the user's terms.
pub enum NetFailure {
    /// See [`Reply::Unreachable`].
    Unreachable(String),
    /// See [`Reply::Transient`].
    Transient(String),
}

impl From<NetFailure> for Reply {
    fn from(f: NetFailure) -> Self {
        match f {
            NetFailure::Unreachable(reason) => Reply::Unreachable(reason),
            NetFailure::Transient(reason) => Reply::Transient(reason),
        }
    }
}

impl Hub {
    /// `HF_ENDPOINT` (default huggingface.co), the user's token, if any, and the
    /// default patience.
    pub fn from_env() -> Self {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
        Self::new(endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), token_from_env(), Patience::default())
    }

    /// `patience`: the timeouts and retry pacing of every request (tests shorten them).
    pub fn new(endpoint: &str, token: Option<String>, patience: Patience) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_resolve(Some(patience.connect))
            .timeout_connect(Some(patience.connect))
            .timeout_recv_response(Some(patience.idle))
            // A stalled body is dropped and resumed rather than waited on.
            .timeout_per_read(Some(patience.idle))
            // The hub redirects LFS files to a signed CDN URL; the token stays on the hub.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("ostinato/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self { endpoint: endpoint.trim_end_matches('/').to_string(), token, agent, patience }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn patience(&self) -> Patience {
        self.patience
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `{endpoint}/{repo}/resolve/{commit}/{path}`.
    pub fn file_url(&self, repo: &str, commit: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{commit}/{}", self.endpoint, encode_path(path))
    }

    /// A GET, from byte `from` on when it is not 0.
    pub fn get(&self, url: &str, from: u64) -> Reply {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if from > 0 {
            req = req.header("Range", format!("bytes={from}-"));
        }
        match req.call() {
            Err(e) => self.failure(e).into(),
            Ok(resp) => match resp.status().as_u16() {
                200..=299 => Reply::Ok(resp),
                404 => Reply::NotFound,
                s @ (401 | 403) => Reply::Denied(s),
                s @ (408 | 429 | 500..=599) => Reply::Transient(format!("HTTP {s}")),
                s => Reply::Unexpected(s),
            },
        }
    }

    /// Why a request or a body read (its `io::Error` converts) failed.
    pub fn failure(&self, e: ureq::Error) -> NetFailure {
        use std::io::ErrorKind::{ConnectionRefused, HostUnreachable, NetworkDown, NetworkUnreachable};
        let p = &self.patience;
        match e {
            ureq::Error::HostNotFound => NetFailure::Unreachable(self.unreachable("its name does not resolve")),
            ureq::Error::Io(e)
                if matches!(e.kind(), ConnectionRefused | HostUnreachable | NetworkUnreachable | NetworkDown) =>
            {
                NetFailure::Unreachable(self.unreachable(&e.to_string()))
            }
            ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
                NetFailure::Transient(format!("no connection within {}", seconds(p.connect)))
            }
            ureq::Error::Timeout(_) => NetFailure::Transient(format!("the hub sent nothing for {}", seconds(p.idle))),
            e => NetFailure::Transient(e.to_string()),
        }
    }

    fn unreachable(&self, cause: &str) -> String {
        format!(
            "cannot reach the hub at {} ({cause}): check the network connection, or, where the hub is \
             blocked, set HF_ENDPOINT to the address of a mirror of it",
            self.endpoint
        )
    }

    /// The repository at `revision`: its commit and files with sizes and ids. A failed
    /// try is said to `on_retry` (with its reason) and tried again after a wait.
    pub fn listing(
        &self,
        repo: &str,
        revision: &str,
        on_retry: &mut dyn FnMut(Retry, String),
        cancel: &Cancel,
    ) -> Result<RepoListing> {
        let url = format!("{}/api/models/{repo}/revision/{}?blobs=true", self.endpoint, encode_path(revision));
        let what = format!("{repo} ({url})");
        let mut retries = Retries::new(self.patience);
        loop {
            let reason = match self.get(&url, 0) {
                Reply::Ok(resp) => match resp.into_body().read_to_string() {
                    Ok(text) => return parse_listing(repo, &text).map_err(|reason| Error::download(&what, reason)),
                    Err(e) => match self.failure(e) {
                        NetFailure::Unreachable(reason) => return Err(Error::download(what, reason)),
                        NetFailure::Transient(reason) => reason,
                    },
                },
                Reply::NotFound => {
                    return Err(Error::download(
                        what,
                        format!("no such repository or revision `{revision}` on {}", self.endpoint),
                    ))
                }
                Reply::Denied(s) => return Err(Error::download(what, denied_reason(s, self.has_token()))),
                Reply::Unexpected(s) => return Err(Error::download(what, format!("unexpected HTTP {s}"))),
                Reply::Unreachable(reason) => return Err(Error::download(what, reason)),
                Reply::Transient(reason) => reason,
            };
            let Some(retry) = retries.failed() else {
                return Err(Error::download(what, format!("gave up after {} tries: {reason}", retries.tries())));
            };
            on_retry(retry, reason);
            wait(retry.wait, cancel)?;
        }
    }
}

pub fn denied_reason(status: u16, has_token: bool) -> String {
    if has_token {
        format!("HTTP {status}: the token was refused; accept the repository's terms on its page, or check HF_TOKEN")
    } else {
        format!("HTTP {status}: the repository is gated or private; log in (`hf auth login`) or set HF_TOKEN")
    }
}

fn parse_listing(repo: &str, text: &str) -> std::result::Result<RepoListing, String> {
    let api: ApiRevision = serde_json::from_str(text).map_err(|e| format!("unreadable file list: {e}"))?;
    let files = api
        .siblings
        .into_iter()
        .map(|s| {
            let (size, id) = match (s.lfs, s.blob_id, s.size) {
                (Some(lfs), _, _) => (lfs.size, BlobId::Sha256(lfs.sha256.to_ascii_lowercase())),
                (None, Some(blob), Some(size)) => (size, BlobId::GitSha1(blob.to_ascii_lowercase())),
                _ => return Err(format!("{}: the hub gave no size or id", s.rfilename)),
            };
            if BlobId::from_name(id.name()).as_ref() != Some(&id) {
                return Err(format!("{}: `{}` is not a checksum", s.rfilename, id.name()));
            }
            Ok(RemoteFile { path: s.rfilename, size, id })
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok(RepoListing { repo: repo.to_string(), commit: api.sha, files })
}

/// Percent-encodes a repository path, keeping `/`.
fn encode_path(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `HF_TOKEN`, else the file `HF_TOKEN_PATH` names, else `$HF_HOME/token`, else
/// `~/.cache/huggingface/token` (where `hf auth login` writes it).
pub fn token_from_env() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Some(t.trim().to_string());
    }
    let path = std::env::var_os("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        let home = std::env::var_os("HF_HOME")
            .map(PathBuf::from)
            .or_else(|| directories::BaseDirs::new().map(|d| d.home_dir().join(".cache").join("huggingface")))?;
        Some(home.join("token"))
    })?;
    std::fs::read_to_string(path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// One hub cache folder.
#[derive(Debug, Clone)]
pub struct HubCache {
    pub root: PathBuf,
}

impl HubCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `models--<org>--<name>`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(format!("models--{}", repo.replace('/', "--")))
    }

    pub fn blob(&self, repo: &str, id: &BlobId) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(id.name())
    }

    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// Points `snapshots/<commit>/<path>` at its blob with a relative link, as
    /// `huggingface_hub` does (a copy where the system has no symlinks).
    pub fn link(&self, repo: &str, commit: &str, path: &str, id: &BlobId) -> Result<PathBuf> {
        let file = self.snapshot(repo, commit).join(path);
        let parent = file.parent().expect("a snapshot file has a folder");
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let depth = path.split('/').count() + 1;
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(id.name());
        let tmp = parent.join(format!(".{}.link", id.name()));
        let _ = std::fs::remove_file(&tmp);
        symlink_or_copy(&target, &parent.join(&target), &tmp)?;
        std::fs::rename(&tmp, &file).map_err(|e| Error::io(&file, e))?;
        Ok(file)
    }

    /// Writes `refs/<revision>` = `commit`, atomically.
    pub fn set_ref(&self, repo: &str, revision: &str, commit: &str) -> Result<()> {
        let refs = self.repo_dir(repo).join("refs");
        std::fs::create_dir_all(&refs).map_err(|e| Error::io(&refs, e))?;
        let tmp = refs.join(format!(".{revision}.tmp"));
        std::fs::write(&tmp, commit).map_err(|e| Error::io(&tmp, e))?;
        let path = refs.join(revision);
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }
}

/// A symlink `at` -> `target` (relative to `at`'s folder; `resolved` is the same file
/// from here); where symlinks are not allowed (Windows without developer mode), a copy.
fn symlink_or_copy(target: &Path, resolved: &Path, at: &Path) -> Result<()> {
    #[cfg(unix)]
    let linked = std::os::unix::fs::symlink(target, at);
    #[cfg(windows)]
    let linked = std::os::windows::fs::symlink_file(target, at);
    #[cfg(not(any(unix, windows)))]
    let linked: std::io::Result<()> = Err(std::io::ErrorKind::Unsupported.into());
    if linked.is_err() {
        std::fs::copy(resolved, at).map_err(|e| Error::io(at, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
