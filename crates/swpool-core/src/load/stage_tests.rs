//! The mount stage through its seam ([`mounter::Mounter`]): which implementation a load chooses
//! from every node's context, each implementation's mount and release on one node, and the site
//! path's failures on one node of the in-process cluster (the others take their mounts back).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::mounter::{self, Mounter};
use super::tests::{failed_alike, node_context, site, trusted, NodeOutcome, Site, NODES};
use super::*;
use crate::collective::fake::{FakeCluster, FakeRank};
use crate::mount::sys::{Call, FakeScript, FakeSys, Mounts};
use crate::state::Serving;
use crate::trust::{keys, TrustedKey};
use swpool_format::status::ExitStatus;

const HELPER: &str = "/usr/libexec/sw-pool/sw-pool-mount-helper";

/// The configuration of a site with its mount helper.
fn with_helper() -> Config {
    let mut cfg = Config::default();
    cfg.mount_helper.value = Some(PathBuf::from(HELPER));
    cfg
}

/// The site's signing key, installed in the system's trusted-keys directory (the helper's own).
fn system_key(s: &Site) -> TrustedKey {
    let mut k = trusted(&s.key, "site");
    k.path = Path::new(keys::SYSTEM_TRUSTED_KEYS).join("site.pem");
    k
}

fn digest(s: &Site) -> String {
    Pool::open(&s.pool).unwrap().manifest.digest
}

/// The helper's answer to `mount-pool`: the pool mounted at its place for node `n`.
fn helper_mounted(s: &Site, n: usize) -> Result<String, String> {
    Ok(serde_json::json!({
        "name": "demo", "version": "1.0", "digest": digest(s),
        "mount_point": s.root.join(format!("node{n}/helper/demo/1.0")),
        "copied": true, "shared": false, "refs": 1, "loop_device": "loop7",
    })
    .to_string())
}

/// The helper's answer to `mount-pool --digest D` on a node without the copy.
fn not_cached() -> Result<String, String> {
    Ok(r#"{"cached":false}"#.to_string())
}

/// The helper's answer to `release-pool`.
fn released() -> Result<String, String> {
    Ok(r#"{"mount_point":"/x","refs":0,"unmounted":true,"unshadowed":[]}"#.to_string())
}

/// The helper calls `sys` saw, each as its arguments after `sudo -n HELPER`.
fn helper_calls(sys: &FakeSys) -> Vec<String> {
    sys.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Run { args, .. } if args.iter().any(|a| a == HELPER) => Some(
                args.iter()
                    .skip_while(|a| *a != HELPER)
                    .skip(1)
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        })
        .collect()
}

/// A plan for `s`'s pool on node `n` (its cache entry under `node<n>/cache`), trusted by `key`.
fn plan_for(s: &Site, n: usize, key: &TrustedKey) -> Plan {
    let pool = Pool::open(&s.pool).unwrap();
    Plan {
        src: s.pool.clone(),
        dest: s.root.join(format!("node{n}/cache/demo.pool")),
        name: "demo".into(),
        version: "1.0".into(),
        digest: pool.manifest.digest.clone(),
        verdict: Verdict::Trusted {
            name: key.name.clone(),
            fingerprint: key.fingerprint.clone(),
        },
        data_size: pool.manifest.data_size,
    }
}

/// The mount stage each rank of a 4-node, 2-rank job chooses, where the nodes in `helper_on` have
/// the site's helper, the pool is signed by `key` (the system's trusted key, else a user's),
/// `full` has no room for the copy.
fn chosen(helper_on: &[usize], system: bool, full: Option<usize>, no_fallback: bool) -> String {
    let s = site();
    let names = FakeCluster::run(NODES, 2, |r: &FakeRank| {
        let n = r.node_index();
        let cfg = if helper_on.contains(&n) {
            with_helper()
        } else {
            Config::default()
        };
        let sys = FakeSys::new(FakeScript {
            euid: s.uid,
            ..Default::default()
        });
        let key = if system {
            system_key(&s)
        } else {
            trusted(&s.key, "mine")
        };
        let node = node_context(&s, &cfg, &sys, n, key.clone());
        let req = LoadRequest {
            pool: s.pool.clone(),
            no_fallback,
            ..LoadRequest::default()
        };
        if full == Some(n) {
            crate::transfer::TEST_FREE_BYTES.with(|c| c.set(Some(4096)));
        }
        let m = mounter::choose(r, &node, &req, &plan_for(&s, n, &key)).unwrap();
        crate::transfer::TEST_FREE_BYTES.with(|c| c.set(None));
        assert!(
            sys.calls().is_empty(),
            "choosing did something: {:?}",
            sys.calls()
        );
        m.name()
    });
    assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
    names[0].to_string()
}

#[test]
fn the_mount_stage_is_chosen_once_from_every_nodes_context() {
    let all = [0, 1, 2, 3];
    assert_eq!(chosen(&[], true, None, false), "cached-copy");
    // every node leader has the helper and the pool is signed by a key of the system's directory
    assert_eq!(chosen(&all, true, None, false), "site-helper");
    // one node without it: no node takes the site path
    assert_eq!(chosen(&[0, 1, 3], true, None, false), "cached-copy");
    // signed by a key only a user trusts: the helper would refuse it
    assert_eq!(chosen(&all, false, None, false), "cached-copy");
    // a node without room for the copy: every node serves the pool where it lies…
    assert_eq!(chosen(&[], true, Some(1), false), "in-place");
    // …unless refused (the copy's preflight then fails, naming the node)
    assert_eq!(chosen(&[], true, Some(1), true), "cached-copy");
    // the site path needs no room in the user's cache where the helper holds the pool
    assert_eq!(chosen(&all, true, Some(1), false), "site-helper");
}

/// One node's context for the direct tests: `sys`, node 0 of `s`, a cache copy of the pool.
fn one_node<'a>(s: &Site, cfg: &'a Config, sys: &'a FakeSys) -> (NodeContext<'a>, Plan) {
    let key = system_key(s);
    let plan = plan_for(s, 0, &key);
    std::fs::copy(&s.pool, &plan.dest).unwrap();
    (node_context(s, cfg, sys, 0, key), plan)
}

fn request(s: &Site, mountpoint: bool) -> LoadRequest {
    LoadRequest {
        pool: s.pool.clone(),
        mountpoint: mountpoint.then(|| s.root.join("node0/mnt")),
        job_id: Some("7".into()),
        timeout: Duration::from_secs(5),
        ..LoadRequest::default()
    }
}

fn records(node: &NodeContext) -> usize {
    node.state.records().unwrap().len()
}

#[test]
fn the_cached_copy_mounts_its_fuse_helper_and_releases_by_reference() {
    let s = site();
    let (cfg, sys) = (Config::default(), FakeSys::new(FakeScript::default()));
    let (node, plan) = one_node(&s, &cfg, &sys);
    let req = request(&s, true);
    let m = mounter::CachedCopy;
    let a = m.mount(&node, &req, &plan).unwrap();
    assert!(!a.reused);
    assert_eq!(a.record.image, plan.dest);
    assert!(matches!(a.record.serving, Some(Serving::Fuse { .. })));
    assert_eq!(sys.mounts().unwrap().len(), 1);
    // a second load: one more reference to the same mount
    let b = m.mount(&node, &req, &plan).unwrap();
    assert!(b.reused);
    assert_eq!(b.record.refcount(), 2);
    m.release(&node, &req, &b);
    assert_eq!(
        sys.mounts().unwrap().len(),
        1,
        "the first load's mount stays"
    );
    assert_eq!(
        node.state
            .read(&a.record.mount_point)
            .unwrap()
            .unwrap()
            .refcount(),
        1
    );
    m.release(&node, &req, &a);
    assert_eq!(sys.mounts().unwrap().len(), 0);
    assert_eq!(records(&node), 0);
}

#[test]
fn in_place_serves_the_pool_file_through_the_chunk_server_and_releases_it() {
    // the default: sw-pool's tree server in one hop, no served file's directory
    let s = site();
    let (cfg, sys) = (Config::default(), FakeSys::new(FakeScript::default()));
    let (node, plan) = one_node(&s, &cfg, &sys);
    let req = request(&s, true);
    let m = mounter::InPlace::new(vec!["fake0: 4 KiB free".into()]);
    assert!(!m.needs_copy());
    let a = m.mount(&node, &req, &plan).unwrap();
    assert_eq!(a.record.image, s.pool);
    assert_eq!(a.record.backend, crate::mount::Backend::SwPoolTree);
    assert!(
        matches!(
            a.record.serving,
            Some(Serving::ChunkServer { dir: None, .. })
        ),
        "{:?}",
        a.record.serving
    );
    assert!(!node.state.serve_path(&a.record.mount_point).exists());
    assert_eq!(sys.mounts().unwrap().len(), 1);
    m.release(&node, &req, &a);
    assert_eq!(sys.mounts().unwrap().len(), 0);
    assert_eq!(records(&node), 0);
    // fuse_reader = "squashfuse_ll": the chunk server's file under squashfuse_ll, two hops
    let mut cfg = Config::default();
    cfg.fuse_reader.value = crate::mount::FuseReader::SquashfuseLl;
    let (node, plan) = one_node(&s, &cfg, &sys);
    let a = m.mount(&node, &req, &plan).unwrap();
    assert_eq!(a.record.backend, crate::mount::Backend::SquashfuseLl);
    let Some(Serving::ChunkServer { dir: Some(dir), .. }) = &a.record.serving else {
        panic!("{:?}", a.record.serving)
    };
    assert!(dir.is_dir());
    assert_eq!(sys.mounts().unwrap().len(), 1);
    let note = m.note(&plan).unwrap();
    assert!(
        note.contains("fake0: 4 KiB free") && note.contains("--no-fallback"),
        "{note}"
    );
    m.release(&node, &req, &a);
    assert_eq!(sys.mounts().unwrap().len(), 0);
    assert!(!dir.exists(), "the chunk server's directory is left");
    assert_eq!(records(&node), 0);
}

#[test]
fn the_site_helper_mounts_at_the_helper_and_releases_there() {
    let s = site();
    let cfg = with_helper();
    let sys = FakeSys::new(FakeScript {
        helper_answers: [not_cached(), helper_mounted(&s, 0), released()].into(),
        ..Default::default()
    });
    let (node, plan) = one_node(&s, &cfg, &sys);
    let req = request(&s, false);
    let m = mounter::SiteHelper::new(HELPER.into());
    // the node's copy by digest first: this node has none
    assert!(m.mount_held(&node, &req, &plan).unwrap().is_none());
    let a = m.mount(&node, &req, &plan).unwrap();
    assert_eq!(a.record.mount_point, s.root.join("node0/helper/demo/1.0"));
    assert!(matches!(
        &a.record.serving,
        Some(Serving::Kernel { helper: Some(h), loop_device, .. })
            if h == Path::new(HELPER) && loop_device == Path::new("/dev/loop7")
    ));
    assert_eq!(records(&node), 1);
    m.release(&node, &req, &a);
    let d = digest(&s);
    assert_eq!(
        helper_calls(&sys),
        [
            format!("mount-pool --digest {d} --job-id 7"),
            format!("mount-pool --job-id 7 {}", plan.dest.display()),
            "release-pool demo/1.0 --job-id 7".to_string(),
        ]
    );
    assert_eq!(records(&node), 0);
    // the helper's mounts are not the user's: nothing in this node's mount table
    assert_eq!(sys.mounts().unwrap().len(), 0);
}

/// A site load on every node (2 ranks each) where `answers(n)` is node `n`'s helper: each rank's
/// outcome and its node's helper calls.
fn run_site(
    s: &Site,
    answers: impl Fn(usize) -> Vec<Result<String, String>> + Sync,
) -> Vec<(NodeOutcome, Vec<String>)> {
    let cfg = with_helper();
    let req = LoadRequest {
        pool: s.pool.clone(),
        cache_dir: Some(s.root.join("node%n/cache")),
        job_id: Some("7".into()),
        timeout: Duration::from_secs(5),
        ..LoadRequest::default()
    };
    FakeCluster::run(NODES, 2, |r: &FakeRank| {
        let n = r.node_index();
        let sys = FakeSys::new(FakeScript {
            euid: s.uid,
            helper_answers: if r.is_leader() {
                answers(n).into()
            } else {
                Default::default()
            },
            ..Default::default()
        });
        let node = node_context(s, &cfg, &sys, n, system_key(s));
        let res = load(r, &node, &req, &Quiet);
        let out = NodeOutcome {
            status: res.as_ref().err().map(Error::exit_status),
            result: res.map_err(|e| e.to_string()),
            mounts: sys.mounts().unwrap().len(),
        };
        (out, helper_calls(&sys))
    })
}

#[test]
fn a_site_load_mounts_every_node_at_the_helper_and_moves_nothing_where_each_holds_it() {
    let s = site();
    let out = run_site(&s, |n| vec![helper_mounted(&s, n)]);
    for (i, (o, calls)) in out.iter().enumerate() {
        let l = o.result.as_ref().unwrap();
        assert_eq!(
            l.mount_point,
            s.root.join(format!("node{}/helper/demo/1.0", i / 2))
        );
        assert!(matches!(l.record.serving, Some(Serving::Kernel { .. })));
        assert_eq!(l.copy.nodes, 0, "nothing moved");
        if i % 2 == 0 {
            assert_eq!(calls.len(), 1, "{calls:?}");
        }
    }
    super::tests::assert_nothing_cached(&s);
}

/// Node 0's helper holds the pool, the others verify the broadcast's copy, and node 2's helper
/// refuses it: every rank fails alike, and every node that mounted, node 0 from its held copy
/// too, asks its helper to release this job's reference; no record is left anywhere.
#[test]
fn a_site_mount_that_fails_on_node_3_takes_back_every_other_nodes_mount() {
    let s = site();
    let out = run_site(&s, |n| match n {
        0 => vec![helper_mounted(&s, 0), released()],
        2 => vec![
            not_cached(),
            Err("sw-pool-mount-helper: chunk 1 does not match its manifest".into()),
        ],
        _ => vec![not_cached(), helper_mounted(&s, n), released()],
    });
    let (outcomes, calls): (Vec<NodeOutcome>, Vec<Vec<String>>) = out.into_iter().unzip();
    let m = failed_alike(&s, &outcomes, "chunk 1 does not match", 2);
    assert!(
        outcomes
            .iter()
            .all(|o| o.status != Some(ExitStatus::Success)),
        "{m}"
    );
    for n in [0, 1, 3] {
        let c = &calls[2 * n];
        assert_eq!(
            c.last().map(String::as_str),
            Some("release-pool demo/1.0 --job-id 7"),
            "node {n}: {c:?}"
        );
    }
    assert!(
        !calls[4].iter().any(|c| c.starts_with("release-pool")),
        "node 2 mounted nothing: {:?}",
        calls[4]
    );
}

/// A read path of the test's own, plugged into `load` through the seam alone
/// ([`super::load_with`]): it records each node's mounts and releases; its mount fails on node
/// `fails_on`.
struct Recorder {
    calls: std::sync::Arc<std::sync::Mutex<Vec<(usize, &'static str)>>>,
    node: usize,
    fails_on: Option<usize>,
    needs_copy: bool,
}

impl Mounter for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn needs_copy(&self) -> bool {
        self.needs_copy
    }
    fn mount(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
    ) -> Result<mounter::NodeMount, Error> {
        if self.fails_on == Some(self.node) {
            return Err(Error::other(
                ExitStatus::System,
                "recorder: nothing mounts here",
            ));
        }
        self.calls.lock().unwrap().push((self.node, "mount"));
        let record = state::Record {
            schema: state::SCHEMA,
            mount_point: req.mountpoint.clone().unwrap(),
            image: plan.dest.clone(),
            format: crate::image::ImageFormat::Squashfs,
            backend: crate::mount::Backend::SquashfuseLl,
            pool: None,
            helper_pid: 0,
            uid: node.uid,
            user: String::new(),
            node: String::new(),
            created: 0,
            refs: Vec::new(),
            pending: false,
            source: None,
            mount_id: None,
            serving: None,
            lease: None,
        };
        Ok(mounter::NodeMount {
            record,
            reused: false,
        })
    }
    fn release(&self, _node: &NodeContext, _req: &LoadRequest, _m: &mounter::NodeMount) {
        self.calls.lock().unwrap().push((self.node, "release"));
    }
}

/// `load` with the recorder as its mount stage on 4 nodes × 2 ranks: each rank's outcome, and the
/// recorder's calls (node, what) in order.
fn run_recorder(
    s: &Site,
    fails_on: Option<usize>,
    needs_copy: bool,
) -> (Vec<NodeOutcome>, Vec<(usize, &'static str)>) {
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let cfg = Config::default();
    let req = LoadRequest {
        pool: s.pool.clone(),
        mountpoint: Some(s.root.join("node%n/mnt")),
        cache_dir: Some(s.root.join("node%n/cache")),
        timeout: Duration::from_secs(5),
        ..LoadRequest::default()
    };
    let out = FakeCluster::run(NODES, 2, |r: &FakeRank| {
        let n = r.node_index();
        let sys = FakeSys::new(FakeScript {
            euid: s.uid,
            ..Default::default()
        });
        let node = node_context(s, &cfg, &sys, n, trusted(&s.key, "site"));
        let calls = calls.clone();
        let choose = move |job: &dyn crate::collective::Collective,
                           _: &NodeContext,
                           _: &LoadRequest,
                           _: &Plan|
              -> Result<Box<dyn Mounter>, Error> {
            Ok(Box::new(Recorder {
                calls: calls.clone(),
                node: job.node_index(),
                fails_on,
                needs_copy,
            }))
        };
        let res = load_with(r, &node, &req, &Quiet, &choose);
        NodeOutcome {
            status: res.as_ref().err().map(Error::exit_status),
            result: res.map_err(|e| e.to_string()),
            mounts: sys.mounts().unwrap().len(),
        }
    });
    let calls = calls.lock().unwrap().clone();
    (out, calls)
}

/// A fourth read path plugs into `load` as one more implementation: `load` places the pool when it
/// asks for the copy (not when it reads the pool where it lies), mounts on each node leader once,
/// and when its mount fails on one node every rank fails alike and every other node releases.
#[test]
fn a_new_read_path_plugs_in_through_the_seam_alone() {
    let s = site();
    let (out, calls) = run_recorder(&s, None, true);
    for (i, o) in out.iter().enumerate() {
        let l = o.result.as_ref().unwrap();
        assert_eq!(l.mount_point, s.root.join(format!("node{}/mnt", i / 2)));
        assert!(l.plan.dest.is_file(), "rank {i}: no copy placed");
    }
    let mut mounted: Vec<usize> = calls.iter().map(|(n, _)| *n).collect();
    mounted.sort();
    assert_eq!(mounted, [0, 1, 2, 3], "{calls:?}");
    assert!(calls.iter().all(|(_, c)| *c == "mount"), "{calls:?}");

    let s = site();
    let (out, calls) = run_recorder(&s, Some(2), false);
    failed_alike(&s, &out, "recorder: nothing mounts here", 2);
    super::tests::assert_nothing_cached(&s);
    for n in [0, 1, 3] {
        let mine: Vec<&str> = calls.iter().filter(|c| c.0 == n).map(|c| c.1).collect();
        assert_eq!(mine, ["mount", "release"], "node {n}: {calls:?}");
    }
    assert!(calls.iter().all(|c| c.0 != 2), "{calls:?}");
}
