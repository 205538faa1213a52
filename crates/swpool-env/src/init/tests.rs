//! Pid 1's set-up order on the recording fake of the `Kernel` seam: every method, every step
//! failing in turn, and what may fail without stopping the start.

use std::path::{Path, PathBuf};

use rustix::io::Errno;

use super::{setup, SetupError, Spec};
use crate::idmap::{Handshake, Views};
use crate::kernel::{FakeKernel, Step};
use crate::layer::Layer;
use crate::plan::Method;

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn spec(method: Method) -> Spec {
    Spec {
        uid: 1000,
        gid: 1000,
        root: false,
        method,
        layer: None,
        layer_fds: None,
        lower: None,
        identity: false,
        fuse_overlayfs: None,
        bases: vec![],
        squashfuse: None,
        tree_server: None,
        pools: vec![],
        fuse2fs: None,
        binds: vec![p("/home"), p("/dev")],
        shadows: vec![(p("/pools/gcc/13/install/x"), p("/opt/x"))],
        cwd: p("/home/u/work"),
        argv: vec!["true".into()],
        name: "-".into(),
        verbose: false,
        socket: None,
        keep_fds: vec![],
        handshake_fd: None,
    }
}

/// A layer in the user's home: `/home` is bound in, so its copy of the overlay is detached.
fn layered(method: Method) -> Spec {
    let d = p("/home/u/.local/share/sw-pool/layers/dev");
    Spec {
        layer: Some(Layer {
            name: "dev".into(),
            upper: d.join("upper"),
            work: d.join("work"),
            merged: d.join("merged"),
            dir: d,
        }),
        layer_fds: Some([10, 11, 12, 13]),
        ..spec(method)
    }
}

fn merged() -> PathBuf {
    p("/home/u/.local/share/sw-pool/layers/dev/merged")
}

/// What pid 1 does after the root is its working directory, in order.
fn new_root_tail(root: &Path) -> Vec<Step> {
    vec![
        Step::BindRecursive {
            src: p("/home"),
            at: p("./home"),
        },
        Step::BindRecursive {
            src: p("/dev"),
            at: p("./dev"),
        },
        Step::Detach(Path::new(".").join(merged().strip_prefix("/").unwrap())),
        Step::Proc(p("./proc")),
        Step::Pools(root.into()),
        Step::Bind {
            src: p("/pools/gcc/13/install/x"),
            at: p("./opt/x"),
        },
        Step::MoveToRoot,
        Step::Chroot,
        Step::Chdir(p("/home/u/work")),
    ]
}

#[test]
fn plain_keeps_the_hosts_root_and_mounts_proc_pools_shadows_in_place() {
    let k = FakeKernel::default();
    setup(&k, &spec(Method::Plain)).unwrap();
    assert_eq!(
        k.steps(),
        vec![
            Step::Private,
            Step::Bases,
            Step::Proc(p("/proc")),
            Step::Pools(p("/")),
            Step::Bind {
                src: p("/pools/gcc/13/install/x"),
                at: p("/opt/x"),
            },
            Step::Chdir(p("/home/u/work")),
        ]
    );
}

#[test]
fn a_layer_is_entered_through_its_overlays_descriptor_then_bound_moved_and_entered() {
    let k = FakeKernel::default();
    setup(&k, &layered(Method::FuseOverlay)).unwrap();
    let fd = k.handed.borrow()[0];
    let mut want = vec![
        Step::Private,
        Step::Bases,
        Step::ReopenLayer,
        Step::Overlay(Method::FuseOverlay),
        Step::Fchdir(fd),
    ];
    want.extend(new_root_tail(&merged()));
    assert_eq!(k.steps(), want);
}

#[test]
fn the_layers_copy_is_detached_only_when_a_bound_mount_holds_it() {
    let mut s = layered(Method::BaseOverlay);
    s.binds = vec![p("/dev")];
    let k = FakeKernel::default();
    setup(&k, &s).unwrap();
    assert!(k.steps().contains(&Step::Overlay(Method::BaseOverlay)));
    assert!(!k.steps().iter().any(|s| matches!(s, Step::Detach(_))));
}

#[test]
fn a_base_without_a_layer_is_the_root_and_a_base_without_proc_is_named() {
    let mut s = spec(Method::Base);
    s.bases = vec![crate::Base {
        label: "debian/12".into(),
        image: p("/var/tmp/sw-pool/debian-12.img"),
        at: p("/pools/debian/12"),
        digest: None,
    }];
    let k = FakeKernel::default();
    setup(&k, &s).unwrap();
    let steps = k.steps();
    assert_eq!(
        steps[..4],
        [
            Step::Private,
            Step::Bases,
            Step::BaseRoot,
            Step::Chdir(p("/pools/debian/12"))
        ]
    );
    assert_eq!(steps.last(), Some(&Step::Chdir(p("/home/u/work"))));
    assert!(steps.contains(&Step::MoveToRoot) && steps.contains(&Step::Chroot));

    let k = FakeKernel::failing(Step::Proc(p("./proc")), Errno::NOENT);
    let e = setup(&k, &s).unwrap_err();
    assert!(matches!(&e, SetupError::NoProcInBase { base } if base == "debian/12"));
    assert!(e.to_string().contains("has no /proc directory"), "{e}");
    assert_eq!(k.steps().last(), Some(&Step::Proc(p("./proc"))));
}

#[test]
fn each_failing_step_stops_the_set_up_names_itself_and_exits_125() {
    let s = layered(Method::FuseOverlay);
    type Is = fn(&SetupError) -> bool;
    let cases: Vec<(Step, Is, &str)> = vec![
        (
            Step::Private,
            |e| matches!(e, SetupError::Private(_)),
            "cannot make the mounts private",
        ),
        (
            Step::Bases,
            |e| matches!(e, SetupError::Stage(_)),
            "Bases failed",
        ),
        (
            Step::ReopenLayer,
            |e| matches!(e, SetupError::Stage(_)),
            "ReopenLayer failed",
        ),
        (
            Step::Overlay(Method::FuseOverlay),
            |e| matches!(e, SetupError::Stage(_)),
            "Overlay(FuseOverlay) failed",
        ),
        (
            Step::BindRecursive {
                src: p("/dev"),
                at: p("./dev"),
            },
            |e| matches!(e, SetupError::Bind { host, .. } if host == Path::new("/dev")),
            "cannot bind the host's /dev into the environment",
        ),
        (
            Step::Proc(p("./proc")),
            |e| matches!(e, SetupError::Proc(_)),
            "cannot mount /proc",
        ),
        (
            Step::Pools(merged()),
            |e| matches!(e, SetupError::Stage(_)),
            "Pools",
        ),
        (
            Step::MoveToRoot,
            |e| matches!(e, SetupError::MoveRoot(_)),
            "cannot move the environment's root into place",
        ),
        (
            Step::Chroot,
            |e| matches!(e, SetupError::Chroot(_)),
            "cannot change into the environment's root",
        ),
    ];
    for (step, kind, text) in cases {
        let k = FakeKernel::failing(step.clone(), Errno::ACCESS);
        let e = setup(&k, &s).unwrap_err();
        assert!(kind(&e), "{step:?}: {e:?}");
        assert!(e.to_string().contains(text), "{step:?}: {e}");
        assert_eq!(e.exit_status(), crate::EXIT_SETUP);
        assert_eq!(k.steps().last(), Some(&step), "nothing after {step:?}");
    }
}

#[test]
fn what_may_fail_without_stopping_the_start() {
    let s = layered(Method::FuseOverlay);
    // a host mount with nothing to bind onto, a shadow, the working directory: passed over
    let k = FakeKernel {
        fails: vec![
            (
                Step::BindRecursive {
                    src: p("/home"),
                    at: p("./home"),
                },
                Errno::NOENT,
            ),
            (
                Step::Bind {
                    src: p("/pools/gcc/13/install/x"),
                    at: p("./opt/x"),
                },
                Errno::PERM,
            ),
            (Step::Chdir(p("/home/u/work")), Errno::NOENT),
            (
                Step::Detach(Path::new(".").join(merged().strip_prefix("/").unwrap())),
                Errno::INVAL,
            ),
        ],
        ..FakeKernel::default()
    };
    setup(&k, &s).unwrap();
    let steps = k.steps();
    assert_eq!(
        steps[steps.len() - 4..],
        [
            Step::MoveToRoot,
            Step::Chroot,
            Step::Chdir(p("/home/u/work")),
            Step::Chdir(p("/"))
        ]
    );
}

#[test]
fn a_layer_needs_its_opened_directories_and_an_overlay_needs_a_layer() {
    let mut s = layered(Method::FuseOverlay);
    s.layer_fds = None;
    let k = FakeKernel::default();
    let e = setup(&k, &s).unwrap_err();
    assert!(
        matches!(&e, SetupError::NoLayerDirs(n) if n == "dev"),
        "{e}"
    );
    assert_eq!(k.steps(), vec![Step::Private, Step::Bases]);

    let k = FakeKernel::default();
    let e = setup(&k, &spec(Method::FuseOverlay)).unwrap_err();
    assert!(matches!(e, SetupError::OverlayWithoutLayer), "{e}");
    assert!(!k.steps().contains(&Step::Proc(p("./proc"))));
}

fn views() -> Views {
    Views {
        holder: 4242,
        staging: p("/run/sw-pool/idmap/1"),
        trees: vec![p("/usr"), p("/opt")],
    }
}

#[test]
fn the_kernel_path_enters_the_helpers_views_first_then_mounts_the_trees() {
    let mut s = layered(Method::KernelOverlay);
    s.handshake_fd = Some(7);
    // `/` among the trees: its overlay is the new root
    let k = FakeKernel {
        handshake: Some(Handshake::Views(views())),
        trees_make_root: true,
        ..FakeKernel::default()
    };
    setup(&k, &s).unwrap();
    let fd = k.handed.borrow()[0];
    let mut want = vec![
        Step::ReceiveViews(7),
        Step::EnterViews,
        Step::Private,
        Step::Bases,
        Step::ReopenLayer,
        Step::MountTrees,
        Step::Fchdir(fd),
    ];
    want.extend(new_root_tail(&merged()));
    assert_eq!(k.steps(), want);

    // views of some trees only: mounted in place, the host's root stays
    let k = FakeKernel {
        handshake: Some(Handshake::Views(views())),
        ..FakeKernel::default()
    };
    setup(&k, &s).unwrap();
    assert_eq!(
        k.steps()[5..],
        [
            Step::MountTrees,
            Step::Proc(p("/proc")),
            Step::Pools(p("/")),
            Step::Bind {
                src: p("/pools/gcc/13/install/x"),
                at: p("/opt/x"),
            },
            Step::Chdir(p("/home/u/work")),
        ]
    );

    // the helper's namespace cannot be entered: nothing is mounted
    let k = FakeKernel {
        handshake: Some(Handshake::Views(views())),
        ..FakeKernel::failing(Step::EnterViews, Errno::PERM)
    };
    assert!(matches!(setup(&k, &s), Err(SetupError::Stage(_))));
    assert_eq!(k.steps(), vec![Step::ReceiveViews(7), Step::EnterViews]);
}

#[test]
fn the_kernel_path_refused_falls_back_to_fuse_overlayfs_seeding_roots_upper() {
    let mut s = layered(Method::KernelOverlay);
    s.handshake_fd = Some(7);
    s.root = true;
    let k = FakeKernel {
        handshake: Some(Handshake::Rootless("no helper".into())),
        ..FakeKernel::default()
    };
    setup(&k, &s).unwrap();
    let steps = k.steps();
    assert_eq!(
        steps[..6],
        [
            Step::ReceiveViews(7),
            Step::SeedRootless(p("/home/u/.local/share/sw-pool/layers/dev/upper")),
            Step::Private,
            Step::Bases,
            Step::ReopenLayer,
            Step::Overlay(Method::FuseOverlay),
        ]
    );
    // without --root nothing is seeded
    s.root = false;
    let k = FakeKernel {
        handshake: Some(Handshake::Rootless("no helper".into())),
        ..FakeKernel::default()
    };
    setup(&k, &s).unwrap();
    assert!(!k.steps().iter().any(|s| matches!(s, Step::SeedRootless(_))));
}
