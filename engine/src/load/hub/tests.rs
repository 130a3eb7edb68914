use super::*;

#[test]
fn failures_say_whether_to_retry_and_what_to_do() {
    let hub = Hub::new("http://127.0.0.1:9", None, Patience::default());
    let say = |e: ureq::Error| match hub.failure(e) {
        NetFailure::Unreachable(r) => format!("unreachable: {r}"),
        NetFailure::Transient(r) => format!("transient: {r}"),
    };
    let refused = say(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
    assert!(
        refused.starts_with("unreachable: cannot reach the hub at http://127.0.0.1:9 (")
            && refused.contains("HF_ENDPOINT")
    );
    assert!(say(ureq::Error::HostNotFound)
        .contains("unreachable: cannot reach the hub at http://127.0.0.1:9 (its name does not resolve)"));
    assert_eq!(say(ureq::Error::Timeout(ureq::Timeout::Connect)), "transient: no connection within 10 s");
    assert_eq!(say(ureq::Error::Timeout(ureq::Timeout::RecvResponse)), "transient: the hub sent nothing for 30 s");
    // A body read's io::Error carries ureq's timeout.
    let read = std::io::Error::other(ureq::Error::Timeout(ureq::Timeout::PerRead));
    assert_eq!(say(read.into()), "transient: the hub sent nothing for 30 s");
    let reset = say(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into());
    assert!(reset.starts_with("transient: "), "{reset}");
}

#[test]
fn blob_ids_check_sha256_and_git_sha1() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"hello\n").unwrap();
    // `printf 'hello\n' | sha256sum` and `git hash-object`.
    let sha = BlobId::from_name("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03").unwrap();
    let git = BlobId::from_name("ce013625030ba8dba906f756967f9e9ca394464a").unwrap();
    assert_eq!(sha.check_file(&f).unwrap(), Ok(()));
    assert_eq!(git.check_file(&f).unwrap(), Ok(()));
    std::fs::write(&f, b"hello!\n").unwrap();
    assert!(sha.check_file(&f).unwrap().unwrap_err().starts_with("sha256 mismatch"));
    assert!(BlobId::from_name("model.safetensors").is_none());
}

#[test]
fn listing_reads_lfs_and_git_ids() {
    let text = r#"{"sha":"abc","siblings":[
        {"rfilename":"vae/config.json","size":3,"blobId":"ce013625030ba8dba906f756967f9e9ca394464a"},
        {"rfilename":"vae/w.safetensors","size":9,"blobId":"1111111111111111111111111111111111111111",
         "lfs":{"sha256":"5891B5B522D5DF086D0FF0B110FBD9D21BB4FC7163AF34D08286A2E846F6BE03","size":9,"pointerSize":130}}]}"#;
    let l = parse_listing("o/r", text).unwrap();
    assert_eq!(l.commit, "abc");
    assert!(matches!(&l.files[0].id, BlobId::GitSha1(h) if h.starts_with("ce01")));
    assert!(matches!(&l.files[1].id, BlobId::Sha256(h) if h.starts_with("5891b5")));
    assert!(parse_listing("o/r", r#"{"sha":"a","siblings":[{"rfilename":"x"}]}"#).unwrap_err().contains("x: "));
}

#[test]
fn cache_layout_matches_huggingface_hub() {
    let dir = tempfile::tempdir().unwrap();
    let cache = HubCache::new(dir.path());
    let id = BlobId::from_name("ce013625030ba8dba906f756967f9e9ca394464a").unwrap();
    let blob = cache.blob("ACE-Step/Ace-Step1.5", &id);
    assert!(blob.ends_with("models--ACE-Step--Ace-Step1.5/blobs/ce013625030ba8dba906f756967f9e9ca394464a"));
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, b"hello\n").unwrap();
    let file = cache.link("ACE-Step/Ace-Step1.5", "c0ffee", "vae/config.json", &id).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"hello\n");
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(&file).unwrap(),
        Path::new("../../../blobs/ce013625030ba8dba906f756967f9e9ca394464a")
    );
    // Linking again replaces the link.
    cache.link("ACE-Step/Ace-Step1.5", "c0ffee", "vae/config.json", &id).unwrap();
    cache.set_ref("ACE-Step/Ace-Step1.5", "main", "c0ffee").unwrap();
    let repo = cache.repo_dir("ACE-Step/Ace-Step1.5");
    assert_eq!(crate::load::folder::hf_snapshot(&repo), Some(repo.join("snapshots/c0ffee")));
    assert_eq!(encode_path("a b/c+d.json"), "a%20b/c%2Bd.json");
}
