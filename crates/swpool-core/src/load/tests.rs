//! The load pipeline on an in-process cluster ([`FakeCluster`]): real pool files, real copies into
//! per-node cache directories, real trust checks; the FUSE helper is the recording fake. Each test
//! fails one step on one node and checks that every rank gets the same error and that nothing is
//! left on any node (no temporary file, no mount, no record).

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Duration;

use super::*;
use crate::collective::fake::{FakeCluster, FakeRank};
use crate::mount::sys::{FakeHelper, FakeScript, FakeSys, Mounts};
use crate::pool::manifest::sample;
use crate::pool::trailer::write_trailer;
use crate::transfer::Authorized;
use crate::trust::{keys, sign_pool, TrustedKey};
use swpool_format::status::ExitStatus;

pub(super) const NODES: usize = 4;

pub(super) struct Site {
    _d: tempfile::TempDir,
    pub(super) root: PathBuf,
    pub(super) pool: PathBuf,
    pub(super) key: openssl::pkey::PKey<openssl::pkey::Private>,
    pub(super) uid: u32,
}

/// A squashfs-like image (a superblock claiming `bytes_used`, random data) as a signed pool.
pub(super) fn write_pool(path: &Path, seed: u8, key: &openssl::pkey::PKey<openssl::pkey::Private>) {
    let mut image = vec![0u8; 3 << 20];
    image[0..4].copy_from_slice(b"hsqs");
    let len = image.len() as u64;
    image[40..48].copy_from_slice(&len.to_le_bytes());
    let mut x = 0x9e37_79b9_u32.wrapping_add(seed as u32);
    for b in image[4096..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let m = sample(&image, 1 << 20);
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).unwrap();
    std::io::Write::write_all(&mut f, &image).unwrap();
    write_trailer(&mut f, image.len() as u64, &m.to_json(), &[]).unwrap();
    drop(f);
    sign_pool(&tmp, key, None).unwrap();
    let _ = std::fs::remove_file(crate::trust::detached_path(&tmp));
    std::fs::rename(&tmp, path).unwrap();
}

pub(super) fn site() -> Site {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let key = keys::generate(keys::Algorithm::Ed25519).unwrap();
    let pool = root.join("shared/demo.sqfs");
    std::fs::create_dir_all(pool.parent().unwrap()).unwrap();
    write_pool(&pool, 1, &key);
    for n in 0..NODES {
        std::fs::create_dir_all(root.join(format!("node{n}/cache"))).unwrap();
    }
    Site {
        _d: d,
        root,
        pool,
        key,
        uid: rustix::process::geteuid().as_raw(),
    }
}

pub(super) fn trusted(key: &openssl::pkey::PKey<openssl::pkey::Private>, name: &str) -> TrustedKey {
    let public =
        openssl::pkey::PKey::public_key_from_pem(&key.public_key_to_pem().unwrap()).unwrap();
    TrustedKey {
        name: name.into(),
        path: PathBuf::from(format!("/fake/{name}.pem")),
        fingerprint: keys::fingerprint(&public).unwrap(),
        key: public,
    }
}

/// Node `n` of the site: its record store, trusting `key` only.
pub(super) fn node_context<'a>(
    s: &Site,
    cfg: &'a Config,
    sys: &'a FakeSys,
    n: usize,
    key: TrustedKey,
) -> NodeContext<'a> {
    let keys = crate::trust::TrustedKeys {
        keys: vec![key],
        ..Default::default()
    };
    static NO_ENV: Environment = Environment::empty();
    NodeContext {
        cfg,
        env: &NO_ENV,
        policy: crate::trust::policy_from_config(cfg, keys),
        uid: s.uid,
        sys,
        state: StateDir::open(&s.root.join(format!("node{n}/state")), s.uid).unwrap(),
    }
}

/// What each node looks like, and how to break one.
#[derive(Default, Clone, Copy)]
struct Faults {
    /// This node's trusted key has the signer's fingerprint but another key (bad signature).
    bad_signature_on: Option<usize>,
    /// This node's disk has no free space.
    full_disk_on: Option<usize>,
    /// This node's FUSE helper exits instead of mounting.
    mount_fails_on: Option<usize>,
    /// The leaders have no data plane: every receiving node copies by itself (a job without MPI).
    no_data_plane: bool,
    /// `--no-fallback`: a node without room fails the load instead of serving in place.
    no_fallback: bool,
}

pub(super) struct NodeOutcome {
    pub(super) result: Result<Loaded, String>,
    pub(super) status: Option<ExitStatus>,
    pub(super) mounts: usize,
}

fn run(
    s: &Site,
    ranks_per_node: usize,
    faults: Faults,
    observer: &dyn Observer,
) -> Vec<NodeOutcome> {
    let cfg = Config::default();
    let req = LoadRequest {
        pool: s.pool.clone(),
        mountpoint: Some(s.root.join("node%n/mnt")),
        cache_dir: Some(s.root.join("node%n/cache")),
        timeout: Duration::from_secs(5),
        no_fallback: faults.no_fallback,
        ..LoadRequest::default()
    };
    let each = |r: &FakeRank| {
        let n = r.node_index();
        let sys = FakeSys::new(FakeScript {
            helper: if faults.mount_fails_on == Some(n) {
                FakeHelper::Exits(1, "fuse: mount failed: Operation not permitted".into())
            } else {
                FakeHelper::Mounts
            },
            euid: s.uid,
            ..Default::default()
        });
        let mut key = trusted(&s.key, "site");
        if faults.bad_signature_on == Some(n) {
            key.key = trusted(&keys::generate(keys::Algorithm::Ed25519).unwrap(), "x").key;
        }
        let node = node_context(s, &cfg, &sys, n, key);
        if faults.full_disk_on == Some(n) {
            crate::transfer::TEST_FREE_BYTES.with(|c| c.set(Some(4096)));
        }
        let res = load(r, &node, &req, observer);
        crate::transfer::TEST_FREE_BYTES.with(|c| c.set(None));
        NodeOutcome {
            status: res.as_ref().err().map(Error::exit_status),
            result: res.map_err(|e| e.to_string()),
            mounts: sys.mounts().unwrap().len(),
        }
    };
    match faults.no_data_plane {
        true => FakeCluster::run_without_data_plane(NODES, ranks_per_node, each),
        false => FakeCluster::run(NODES, ranks_per_node, each),
    }
}

/// Every rank failed with the same message; nothing is left anywhere.
pub(super) fn failed_alike(s: &Site, out: &[NodeOutcome], needle: &str, node: usize) -> String {
    let msgs: Vec<&String> = out
        .iter()
        .map(|o| o.result.as_ref().err().unwrap())
        .collect();
    assert!(msgs.iter().all(|m| *m == msgs[0]), "{msgs:#?}");
    assert!(msgs[0].contains(needle), "{}", msgs[0]);
    assert!(msgs[0].contains(&format!("fake{node}")), "{}", msgs[0]);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.mounts, 0, "rank {i} left a mount");
        let st = o.status.unwrap();
        assert!(
            st != ExitStatus::Success && st != ExitStatus::Internal,
            "{st:?}"
        );
    }
    for n in 0..NODES {
        let cache = s.root.join(format!("node{n}/cache"));
        for e in walk(&cache) {
            let name = e.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                !name.contains("swpool-tmp"),
                "a temporary is left: {}",
                e.display()
            );
        }
        let state = s.root.join(format!("node{n}/state"));
        let records: Vec<_> = walk(&state)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        assert!(records.is_empty(), "records left on node {n}: {records:?}");
    }
    msgs[0].clone()
}

/// No node has a cache entry (nothing moved).
pub(super) fn assert_nothing_cached(s: &Site) {
    for n in 0..NODES {
        let cache = s.root.join(format!("node{n}/cache"));
        let entries: Vec<_> = walk(&cache)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "pool"))
            .collect();
        assert!(entries.is_empty(), "node {n} cached {entries:?}");
    }
}

pub(super) fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn loads_on_every_node_with_one_verdict() {
    let s = site();
    let out = run(&s, 2, Faults::default(), &Quiet);
    let first = out[0].result.as_ref().unwrap();
    assert!(matches!(&first.plan.verdict, Verdict::Trusted { name, .. } if name == "site"));
    let original = std::fs::read(&s.pool).unwrap();
    for (i, o) in out.iter().enumerate() {
        let l = o.result.as_ref().unwrap();
        assert_eq!(l.plan.digest, first.plan.digest);
        assert_eq!(l.mount_point, s.root.join(format!("node{}/mnt", i / 2)));
        if i % 2 == 0 {
            assert_eq!(o.mounts, 1, "node {} mounted", i / 2);
            assert_eq!(std::fs::read(&l.plan.dest).unwrap(), original);
        }
    }
    assert_eq!(first.copy.nodes, NODES);
    assert!(!first.reused);
}

#[test]
fn a_bad_signature_on_node_3_fails_every_node() {
    let s = site();
    let f = Faults {
        bad_signature_on: Some(2),
        ..Faults::default()
    };
    let m = failed_alike(&s, &run(&s, 2, f, &Quiet), "signature does not verify", 2);
    assert!(m.contains("do not use this pool"), "{m}");
    // nothing moved: no cache entry anywhere
    assert_nothing_cached(&s);
}

#[test]
fn a_full_disk_on_node_2_fails_every_node_with_no_fallback() {
    let s = site();
    let f = Faults {
        full_disk_on: Some(1),
        no_fallback: true,
        ..Faults::default()
    };
    let m = failed_alike(&s, &run(&s, 2, f, &Quiet), "not enough space", 1);
    assert!(m.contains("free space on this node"), "{m}");
    // the advice names how a user moves the cache (load has no DEST)
    assert!(
        m.contains("--cache-dir") && m.contains("SW_POOL_CACHE"),
        "{m}"
    );
    assert!(!m.contains("DEST"), "{m}");
}

#[test]
fn a_full_disk_on_node_2_serves_the_pool_in_place_on_every_node() {
    let s = site();
    let f = Faults {
        full_disk_on: Some(1),
        ..Faults::default()
    };
    let out = run(&s, 2, f, &Quiet);
    for (i, o) in out.iter().enumerate() {
        let l = o.result.as_ref().unwrap();
        let w = l.in_place.as_deref().expect("a warning");
        assert!(
            w.contains("fake1") && w.contains("1 node(s)") && w.contains("--no-fallback"),
            "{w}"
        );
        if i % 2 == 0 {
            assert_eq!(o.mounts, 1, "node {} mounted", i / 2);
            // the pool file itself, through the chunk server (with the authorized digest)
            assert_eq!(l.record.image, s.pool.canonicalize().unwrap());
            // one hop (the default reader): the tree server at the mount point itself
            assert!(matches!(
                l.record.serving,
                Some(crate::state::Serving::ChunkServer { dir: None, .. })
            ));
        }
    }
    // nothing was copied anywhere
    assert_nothing_cached(&s);
}

#[test]
fn a_mount_that_fails_on_node_4_fails_every_node() {
    let s = site();
    let f = Faults {
        mount_fails_on: Some(3),
        ..Faults::default()
    };
    failed_alike(&s, &run(&s, 2, f, &Quiet), "fuse", 3);
}

/// Replaces the pool on shared storage once every node has checked it, before anything moves.
struct Republish<'a> {
    site: &'a Site,
    all_checked: Barrier,
    replaced: Barrier,
}

impl Observer for Republish<'_> {
    fn authorized(&self, node: usize, _pool: &Path) {
        self.all_checked.wait();
        if node == 0 {
            // an admin republishes: same name, new content, signed by the same trusted key
            let new = self.site.root.join("shared/new.sqfs");
            write_pool(&new, 2, &self.site.key);
            std::fs::rename(&new, &self.site.pool).unwrap();
        }
        self.replaced.wait();
    }
}

#[test]
fn a_pool_changed_between_check_and_copy_is_refused_everywhere() {
    let s = site();
    let obs = Republish {
        site: &s,
        all_checked: Barrier::new(NODES),
        replaced: Barrier::new(NODES),
    };
    let no_plane = Faults {
        no_data_plane: true,
        ..Faults::default()
    };
    let out = run(&s, 2, no_plane, &obs);
    // node 0 reads the very file it checked (still the old pool); the other nodes, which open the
    // path (every receiver reads without a data plane), find the new one: all fail alike
    let m = failed_alike(
        &s,
        &out,
        "changed on shared storage since it was checked",
        1,
    );
    assert!(!m.contains("fake0"), "{m}");
    assert!(m.contains("run load again"), "{m}");
    assert_nothing_cached(&s);
}

#[test]
fn untrusted_and_unsigned_verdicts_carry_a_warning() {
    let p = Path::new("/shared/x.sqfs");
    assert!(Verdict::Trusted {
        name: "a".into(),
        fingerprint: "sha256:00".into()
    }
    .warning(p)
    .is_none());
    let w = Verdict::UntrustedSigner {
        fingerprint: "sha256:ab".into(),
    }
    .warning(p)
    .unwrap();
    assert!(
        w.contains("untrusted key sha256:ab") && w.contains("trusted-keys"),
        "{w}"
    );
    assert!(w.contains("require_signature"), "{w}");
    let u = Verdict::Unsigned.warning(p).unwrap();
    assert!(
        u.contains("unsigned") && u.contains("require_signature"),
        "{u}"
    );
}

#[test]
fn signatures_are_required_by_default_where_keys_are_installed() {
    let key = keys::generate(keys::Algorithm::Ed25519).unwrap();
    let with_keys = crate::trust::TrustedKeys {
        keys: vec![trusted(&key, "site")],
        ..Default::default()
    };
    let cfg = Config::default();
    let p = crate::trust::policy_from_config(&cfg, with_keys.clone());
    assert!(p.require_signature);
    assert!(
        p.origin.to_string().contains("1 trusted key"),
        "{}",
        p.origin
    );
    let p = crate::trust::policy_from_config(&cfg, crate::trust::TrustedKeys::default());
    assert!(!p.require_signature);
    // an explicit `require_signature = false` wins
    let mut cfg = Config::default();
    cfg.apply_env(|k| (k == "SW_POOL_REQUIRE_SIGNATURE").then(|| "false".to_string()))
        .unwrap();
    let p = crate::trust::policy_from_config(&cfg, with_keys);
    assert!(!p.require_signature);
    assert!(
        p.origin.to_string().contains("SW_POOL_REQUIRE_SIGNATURE"),
        "{}",
        p.origin
    );
}

/// The other node leaders authorize node 0's trailer bytes: they parse to the same pool as the
/// file, and bytes cut short or changed are refused, never trusted.
#[test]
fn a_pool_from_its_trailer_bytes_is_the_pool_of_the_file() {
    let s = site();
    let p = Pool::open(&s.pool).unwrap();
    let a = Authorized::of(&p);
    let q = Pool::from_tail(&s.pool, a.len, &a.tail).unwrap();
    assert_eq!(q.manifest.digest, p.manifest.digest);
    assert_eq!(q.signature, p.signature);
    assert_eq!(q.manifest_bytes, p.manifest_bytes);
    assert!(q.file.is_none());
    let policy = TrustPolicy {
        require_signature: true,
        ..crate::trust::policy_from_config(
            &Config::default(),
            crate::trust::TrustedKeys {
                keys: vec![trusted(&s.key, "site")],
                ..Default::default()
            },
        )
    };
    assert!(matches!(
        crate::trust::authorize(&q, &policy).unwrap(),
        Verdict::Trusted { .. }
    ));
    // the tail without its first bytes: the manifest is out of reach
    assert!(Pool::from_tail(&s.pool, a.len, &a.tail[10..]).is_err());
    // one manifest byte changed: its hash in the footer no longer matches
    let mut t = a.tail.clone();
    t[5] ^= 1;
    assert!(Pool::from_tail(&s.pool, a.len, &t).is_err());
    // serialised for the leaders' broadcast and back
    let j = serde_json::to_vec(&a).unwrap();
    assert_eq!(serde_json::from_slice::<Authorized>(&j).unwrap(), a);
}

#[test]
fn the_task_prolog_of_a_loaded_pool_reads_nothing_from_shared_storage() {
    // a job's load mounts the pool on this node; then every task's TaskProlog finds it, by pool
    // file or by NAME/VERSION, with the pool file gone from shared storage (it never opens it)
    let s = site();
    let mut cfg = Config::default();
    cfg.mount_dir.value = Some(s.root.join("node0/pools"));
    let sys = FakeSys::new(FakeScript {
        euid: s.uid,
        ..Default::default()
    });
    let node = node_context(&s, &cfg, &sys, 0, trusted(&s.key, "site"));
    let req = LoadRequest {
        pool: s.pool.clone(),
        cache_dir: Some(s.root.join("node0/cache")),
        job_id: Some("77".into()),
        timeout: Duration::from_secs(5),
        once_per_job: true,
        ..LoadRequest::default()
    };
    let l = load(&crate::Job::single(), &node, &req, &Quiet).unwrap();
    let rec = node.state.read(&l.mount_point).unwrap().unwrap();
    assert_eq!(
        rec.source.as_deref(),
        Some(s.pool.as_path()),
        "the record names the pool file"
    );
    std::fs::rename(&s.pool, s.root.join("moved.sqfs")).unwrap();
    let pool_var = s.pool.to_string_lossy().into_owned();
    for spec in [pool_var.as_str(), "demo/1.0"] {
        let env = Environment::default().with(crate::config::EnvVar::Load, spec);
        let node = NodeContext {
            env: &env,
            state: node.state.clone(),
            policy: node.policy.clone(),
            ..node
        };
        let changes =
            task_prolog(&node, Some("77")).unwrap_or_else(|e| panic!("SW_POOL_LOAD={spec}: {e}"));
        let modulepath = last_set(&changes, "MODULEPATH").unwrap_or_default();
        assert!(
            modulepath.split(':').next()
                == Some(&*l.mount_point.join("modulefiles").to_string_lossy()),
            "{spec}: {changes:?}"
        );
        let pools = last_set(&changes, slurm::JOB_POOLS_VAR).unwrap();
        let pools = slurm::decode_job_pools(&pools).unwrap();
        assert_eq!(pools.len(), 1, "{spec}");
        assert_eq!(
            pools[0].src, s.pool,
            "{spec}: the job's pool list keeps the pool file"
        );
        assert_eq!(pools[0].digest, l.plan.digest);
    }
    // another job holds no reference: its TaskProlog takes the full path, and the pool is gone
    let env = Environment::default().with(crate::config::EnvVar::Load, &pool_var);
    let node = NodeContext { env: &env, ..node };
    let e = task_prolog(&node, Some("78")).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert_eq!(
        node.state.read(&l.mount_point).unwrap().unwrap().refcount(),
        1,
        "no reference was added"
    );
}

#[test]
fn a_full_load_takes_over_what_an_on_demand_run_left_on_each_node() {
    let s = site();
    let pool = crate::pool::Pool::open(&s.pool).unwrap();
    let m = pool.manifest.clone();
    let image = {
        let all = std::fs::read(&s.pool).unwrap();
        all[..m.image_size as usize].to_vec()
    };
    let chunk = |i: usize| &image[m.chunk_range(i as u64).start as usize..][..1 << 20];
    // what lazy runs left: chunks 0 and 1 on every node, chunk 2 on node 1 only; node 3's chunk 1
    // is marked present but holds other bytes (it does not count)
    let mut parts = Vec::new();
    for n in 0..NODES {
        let base = s.root.join(format!("node{n}/cache"));
        let cache = crate::cache::dir(&base, s.uid, true).unwrap();
        let entry = crate::cache::entry_path(&cache, &m.name, &m.version, &m.digest);
        let part = crate::cache::partial_path(&entry);
        let (st, _) =
            swpool_serve::LocalStore::open(&part, &m.digest, m.image_size, m.chunk_size).unwrap();
        st.write_chunk(0, chunk(0)).unwrap();
        match n {
            3 => st.write_chunk(1, &vec![7u8; 1 << 20]).unwrap(),
            _ => st.write_chunk(1, chunk(1)).unwrap(),
        }
        if n == 1 {
            st.write_chunk(2, chunk(2)).unwrap();
        }
        st.flush().unwrap();
        parts.push(part);
    }
    let out = run(&s, 1, Faults::default(), &Quiet);
    let original = std::fs::read(&s.pool).unwrap();
    let first = out[0].result.as_ref().unwrap();
    // chunk 0 moved nowhere; chunk 1 (node 3 lacks it) came from node 0's own copy; only chunk 2
    // was read from shared storage (its reader, node 0, does not hold it)
    assert_eq!(first.copy.bytes_read_from_src, 1 << 20, "{:?}", first.copy);
    // taken from the partial copies: 2 + 3 + 2 + 1 chunks
    assert_eq!(first.copy.bytes_reused, 8 << 20, "{:?}", first.copy);
    for (n, o) in out.iter().enumerate() {
        let l = o.result.as_ref().unwrap();
        assert_eq!(std::fs::read(&l.plan.dest).unwrap(), original, "node {n}");
        assert!(!parts[n].exists(), "node {n} kept its partial copy");
        assert!(!swpool_serve::store::record_path(&parts[n]).exists());
    }
}

/// `place` on the site's nodes (2 ranks each): each rank's node and placement or error.
fn place_all(s: &Site, full: Option<usize>) -> Vec<(usize, Result<Placement, String>)> {
    let cfg = Config::default();
    let req = LoadRequest {
        pool: s.pool.clone(),
        cache_dir: Some(s.root.join("node%n/cache")),
        ..LoadRequest::default()
    };
    FakeCluster::run(NODES, 2, |r: &FakeRank| {
        let n = r.node_index();
        let sys = FakeSys::new(FakeScript {
            euid: s.uid,
            ..Default::default()
        });
        let node = node_context(s, &cfg, &sys, n, trusted(&s.key, "site"));
        if full == Some(n) {
            crate::transfer::TEST_FREE_BYTES.with(|c| c.set(Some(4096)));
        }
        let res = place(r, &node, &req, &Quiet);
        crate::transfer::TEST_FREE_BYTES.with(|c| c.set(None));
        assert_eq!(sys.mounts().unwrap().len(), 0, "node {n} mounted");
        (n, res.map(|p| p.placement).map_err(|e| e.to_string()))
    })
}

/// `place` (`cache fetch`, `run --pool`) on every node: the pipeline up to the verified node-local
/// copy, never a mount; a node without room fails every node alike (no serving in place: the
/// caller wants the copy).
#[test]
fn place_copies_to_every_node_without_mounting_and_fails_alike() {
    let s = site();
    let original = std::fs::read(&s.pool).unwrap();
    let out = place_all(&s, None);
    let first = out[0].1.clone().unwrap();
    for (n, r) in &out {
        let p = r.as_ref().unwrap();
        assert_eq!((&p.name, &p.digest), (&first.name, &first.digest));
        assert!(p.trust.contains("site"), "{}", p.trust);
        assert_eq!(p.format, crate::image::ImageFormat::Squashfs);
        assert!(
            p.image.starts_with(s.root.join(format!("node{n}/cache"))),
            "{}",
            p.image.display()
        );
        assert_eq!(std::fs::read(&p.image).unwrap(), original, "node {n}");
    }
    // placed again: nothing moves, the same copies
    let again = place_all(&s, None);
    assert_eq!(
        again
            .into_iter()
            .map(|(_, r)| r.unwrap())
            .collect::<Vec<_>>(),
        out.into_iter().map(|(_, r)| r.unwrap()).collect::<Vec<_>>()
    );
    // a new site where node 1 has no room: every rank gets the same error, naming it
    let s = site();
    let out = place_all(&s, Some(1));
    let msgs: Vec<String> = out.into_iter().map(|(_, r)| r.unwrap_err()).collect();
    assert!(msgs.iter().all(|m| *m == msgs[0]), "{msgs:#?}");
    assert!(
        msgs[0].contains("not enough space") && msgs[0].contains("fake1"),
        "{}",
        msgs[0]
    );
    assert_nothing_cached(&s);
}

#[test]
fn an_in_place_mount_that_fails_on_node_4_fails_every_node() {
    let s = site();
    let f = Faults {
        full_disk_on: Some(1),
        mount_fails_on: Some(3),
        ..Faults::default()
    };
    failed_alike(&s, &run(&s, 2, f, &Quiet), "fuse", 3);
    assert_nothing_cached(&s);
}
