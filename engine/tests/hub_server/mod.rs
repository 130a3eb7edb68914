//! A Hugging Face hub on 127.0.0.1 for tests: the file-list API
//! (`/api/models/{repo}/revision/{rev}?blobs=true`) and downloads
//! (`/{repo}/resolve/{commit}/{path}`, with HTTP Range), serving files it is given,
//! with faults on request. One thread per connection; every response closes it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha1::Digest;

/// What goes wrong when a file is asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The first response sends this many bytes of the body, then drops the connection.
    DropAfter(usize),
    /// Every response has one byte changed.
    Corrupt,
    /// 404.
    NotFound,
    /// The first response is a 500.
    ServerErrorOnce,
    /// 401 unless the request carries `Authorization: Bearer <token>` (the listing too).
    Gated(String),
    /// The first request's connection is closed without a response.
    HangUpOnce,
    /// Every request is read and never answered: its connection stays open until the
    /// client hangs up.
    NeverAnswers,
    /// The first response sends this many bytes of the body, then nothing more until
    /// the client hangs up.
    StallAfter(usize),
}

/// The fault key of a repository's file list.
fn listing_key(repo: &str) -> String {
    format!("{repo} file list")
}

#[derive(Default)]
struct Repo {
    commit: String,
    files: Vec<(String, Vec<u8>)>,
    declared: HashMap<String, u64>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    faults: HashMap<String, Fault>,
    /// (url path, Range start) of every request.
    log: Vec<(String, Option<u64>)>,
}

pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
}

/// LFS files (weights, tensors) get a sha256 id; the rest a git blob id, as on the hub.
fn is_lfs(path: &str) -> bool {
    path.ends_with(".safetensors") || path.ends_with(".pt")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn git_sha1(data: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    hex(&h.finalize())
}

pub fn sha256(data: &[u8]) -> String {
    hex(&sha2::Sha256::digest(data))
}

/// The id the hub gives the file (and the cache names its blob by).
pub fn blob_id(path: &str, data: &[u8]) -> String {
    if is_lfs(path) {
        sha256(data)
    } else {
        git_sha1(data)
    }
}

impl FakeHub {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &state);
                });
            }
        });
        Self { url, state }
    }

    pub fn add_repo(&self, repo: &str, commit: &str, files: Vec<(String, Vec<u8>)>) {
        let mut s = self.state.lock().unwrap();
        s.repos.insert(repo.into(), Repo { commit: commit.into(), files, declared: HashMap::new() });
    }

    /// Every file under `dir`, at `prefix` + its relative path.
    pub fn add_folder(&self, repo: &str, commit: &str, dir: &Path, prefix: &str) {
        let mut files = Vec::new();
        collect(dir, dir, prefix, &mut files);
        let mut s = self.state.lock().unwrap();
        let r = s.repos.entry(repo.into()).or_default();
        r.commit = commit.into();
        r.files.extend(files);
    }

    pub fn add_repo_file(&self, repo: &str, path: &str, data: Vec<u8>) {
        self.state.lock().unwrap().repos.entry(repo.into()).or_default().files.push((path.into(), data));
    }

    /// The listing says the file has `size` bytes (the download never gets that far).
    pub fn declare_size(&self, repo: &str, path: &str, size: u64) {
        self.state.lock().unwrap().repos.get_mut(repo).unwrap().declared.insert(path.into(), size);
    }

    /// A fault for `{repo}/{path}` (or a whole `{repo}` for `Gated`).
    pub fn fault(&self, key: &str, fault: Fault) {
        self.state.lock().unwrap().faults.insert(key.into(), fault);
    }

    /// A fault for the file list of `repo` (`HangUpOnce` or `NeverAnswers`).
    pub fn fault_listing(&self, repo: &str, fault: Fault) {
        self.fault(&listing_key(repo), fault);
    }

    /// (url path, Range start) of every request so far.
    pub fn requests(&self) -> Vec<(String, Option<u64>)> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn file(&self, repo: &str, path: &str) -> Vec<u8> {
        let s = self.state.lock().unwrap();
        s.repos[repo].files.iter().find(|(p, _)| p == path).unwrap().1.clone()
    }
}

fn collect(base: &Path, dir: &Path, prefix: &str, out: &mut Vec<(String, Vec<u8>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(base, &p, prefix, out);
        } else {
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/");
            out.push((format!("{prefix}{rel}"), std::fs::read(&p).unwrap()));
        }
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    headers: &[(String, String)],
    body: &[u8],
    send: usize,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&body[..send.min(body.len())])?;
    stream.flush()
}

/// Holds the connection open, unanswered, until the client hangs up.
fn wait_for_hang_up(stream: &mut TcpStream) -> std::io::Result<()> {
    std::io::copy(stream, &mut std::io::sink()).map(drop)
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "range" => {
                range = v.trim().strip_prefix("bytes=").and_then(|r| r.trim_end_matches('-').parse::<u64>().ok())
            }
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut s = state.lock().unwrap();
    s.log.push((path.clone(), range));

    // /api/models/{org}/{name}/revision/{rev}
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        let repo = format!("{}/{}", parts[0], parts.get(1).unwrap_or(&""));
        match s.faults.get(&listing_key(&repo)) {
            Some(Fault::HangUpOnce) => {
                s.faults.remove(&listing_key(&repo));
                return Ok(());
            }
            Some(Fault::NeverAnswers) => {
                drop(s);
                return wait_for_hang_up(&mut stream);
            }
            _ => {}
        }
        if let Some(Fault::Gated(token)) = s.faults.get(&repo) {
            if auth.as_deref() != Some(&format!("Bearer {token}")) {
                return respond(&mut stream, "401 Unauthorized", &[], b"{}", 2);
            }
        }
        let Some(r) = s.repos.get(&repo) else {
            return respond(&mut stream, "404 Not Found", &[], b"{\"error\":\"Repository not found\"}", usize::MAX);
        };
        let siblings: Vec<serde_json::Value> = r
            .files
            .iter()
            .map(|(p, data)| {
                let size = r.declared.get(p).copied().unwrap_or(data.len() as u64);
                let mut v = serde_json::json!({"rfilename": p, "size": size, "blobId": git_sha1(data)});
                if is_lfs(p) {
                    v["lfs"] = serde_json::json!({"sha256": sha256(data), "size": size, "pointerSize": 134});
                }
                v
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": r.commit, "siblings": siblings}).to_string();
        return respond(
            &mut stream,
            "200 OK",
            &[("Content-Type".into(), "application/json".into())],
            body.as_bytes(),
            usize::MAX,
        );
    }

    // /{org}/{name}/resolve/{commit}/{path}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if parts.len() < 5 || parts[2] != "resolve" {
        return respond(&mut stream, "404 Not Found", &[], b"", 0);
    }
    let repo = format!("{}/{}", parts[0], parts[1]);
    let key = format!("{repo}/{}", parts[4]);
    if let Some(Fault::Gated(token)) = s.faults.get(&repo) {
        if auth.as_deref() != Some(&format!("Bearer {token}")) {
            return respond(&mut stream, "401 Unauthorized", &[], b"", 0);
        }
    }
    let Some(data) = s
        .repos
        .get(&repo)
        .filter(|r| r.commit == parts[3])
        .and_then(|r| r.files.iter().find(|(p, _)| p == parts[4]))
        .map(|(_, d)| d.clone())
    else {
        return respond(&mut stream, "404 Not Found", &[], b"Entry not found", usize::MAX);
    };
    let mut body = data;
    let mut send = usize::MAX;
    match s.faults.get(&key).cloned() {
        Some(Fault::NotFound) => return respond(&mut stream, "404 Not Found", &[], b"Entry not found", usize::MAX),
        Some(Fault::ServerErrorOnce) => {
            s.faults.remove(&key);
            return respond(&mut stream, "500 Internal Server Error", &[], b"oops", usize::MAX);
        }
        Some(Fault::Corrupt) => {
            let mid = body.len() / 2;
            body[mid] ^= 0x55;
        }
        Some(Fault::DropAfter(n)) => {
            s.faults.remove(&key);
            send = n;
        }
        Some(Fault::HangUpOnce) => {
            s.faults.remove(&key);
            return Ok(());
        }
        Some(Fault::NeverAnswers) => {
            drop(s);
            return wait_for_hang_up(&mut stream);
        }
        Some(Fault::StallAfter(n)) => {
            s.faults.remove(&key);
            drop(s);
            respond(&mut stream, "200 OK", &[], &body, n)?;
            return wait_for_hang_up(&mut stream);
        }
        _ => {}
    }
    drop(s);
    let total = body.len();
    match range {
        Some(from) if from > 0 => {
            let from = from as usize;
            let headers = [("Content-Range".to_string(), format!("bytes {from}-{}/{total}", total - 1))];
            respond(&mut stream, "206 Partial Content", &headers, &body[from..], send)
        }
        _ => respond(&mut stream, "200 OK", &[], &body, send),
    }
}
