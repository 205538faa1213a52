//! The mount stage's choice of sw-pool's tree server (`Backend::SwPoolTree`): its command lines
//! (cached, in place, on demand) and its fallbacks to squashfuse_ll.

use super::*;

#[test]
fn fuse_reader_sw_pool_picks_the_tree_server_only_for_a_squashfs_pool_from_its_file() {
    use FuseReader::*;
    // the default is sw-pool's server
    assert_eq!(FuseReader::default(), SwPool);
    assert_eq!("sw-pool".parse::<FuseReader>(), Ok(SwPool));
    assert_eq!("squashfuse_ll".parse::<FuseReader>(), Ok(SquashfuseLl));
    assert!("fuse2fs".parse::<FuseReader>().is_err());
    assert_eq!(
        pool_image().with_reader(SquashfuseLl).backend,
        Backend::SquashfuseLl
    );
    assert_eq!(
        pool_image().with_reader(SwPool).backend,
        Backend::SwPoolTree
    );
    // a bare image (no manifest digest for the server to check): squashfuse_ll
    assert_eq!(image().with_reader(SwPool).backend, Backend::SquashfuseLl);
    // an ext pool, a writable image: fuse2fs
    let ext = ImageInfo {
        format: ImageFormat::Ext4,
        backend: Backend::Fuse2fs,
        ..pool_image()
    };
    assert_eq!(ext.clone().with_reader(SwPool).backend, Backend::Fuse2fs);
    let rw = ImageInfo {
        writable: true,
        ..ext
    };
    assert_eq!(rw.with_reader(SwPool).backend, Backend::Fuse2fs);
    // served in place or on demand: the tree server too, in one hop
    assert_eq!(
        served_pool().with_reader(SwPool).backend,
        Backend::SwPoolTree
    );
    assert_eq!(
        served_pool().with_reader(SquashfuseLl).backend,
        Backend::SquashfuseLl
    );
}

/// A pool served on demand (chunks from the node's server at a socket, kept in a store).
fn served_pool() -> ImageInfo {
    ImageInfo {
        serve: Some(serve::Serve {
            dir: PathBuf::from("/state/k.serve"),
            digest: "blake3:ef".into(),
            keep: Some(PathBuf::from("/local/k.chunks")),
            source: Some(PathBuf::from("/run/k.sock")),
        }),
        ..pool_image()
    }
}

#[test]
fn a_served_pool_is_read_by_the_tree_server_from_verified_chunks_in_one_hop() {
    let (_d, mp, sys) = setup(FakeHelper::MountsAfter(1));
    let img = served_pool().with_reader(FuseReader::SwPool);
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!((m.backend, m.helper_pid), (Backend::SwPoolTree, 4242));
    let mpd = mp.display().to_string();
    let s = spawned(&sys);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].0, Tool::ChunkServer);
    // not --cached: through the chunk engine, against the authorized digest, no helper
    assert_eq!(
        s[0].1,
        [
            "--tree",
            "--keep",
            "/local/k.chunks",
            "--source",
            "unix:/run/k.sock",
            "--pool",
            "/pools/demo.sqfs",
            "--digest",
            "blake3:ef",
            "--dir",
            mpd.as_str()
        ]
    );
}

#[test]
fn a_served_pool_the_tree_server_refuses_is_served_in_two_hops_with_squashfuse_ll() {
    let (_d, mp, sys) = setup(FakeHelper::Refuses(
        Tool::ChunkServer,
        3,
        "sw-pool-serve: demo: unsupported compressor lzo".into(),
    ));
    let img = served_pool().with_reader(FuseReader::SwPool);
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.backend, Backend::SquashfuseLl);
    let s = spawned(&sys);
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s[0].1.iter().any(|a| a == "--tree"), "{s:?}");
    // the chunk server on the pool, squashfuse_ll on its served file
    let mpd = mp.display().to_string();
    let tail: Vec<&str> = s[1].1.iter().map(|a| a.as_str()).collect();
    assert!(!tail.contains(&"--tree"), "{tail:?}");
    let dash = tail
        .iter()
        .position(|a| *a == "--")
        .expect("a helper after --");
    assert_eq!(
        tail[dash + 1..],
        [
            "squashfuse_ll",
            "-f",
            "-o",
            "ro,nosuid,nodev",
            "/state/k.serve/image",
            mpd.as_str()
        ]
    );
    assert_eq!(state(&sys, &sys.mount_table(), &mp), MountState::Mounted);
}

#[test]
fn the_tree_server_is_started_on_the_pool_file_at_the_mount_point_and_supervised() {
    let (_d, mp, sys) = setup(FakeHelper::MountsAfter(1));
    let img = pool_image().with_reader(FuseReader::SwPool);
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!((m.backend, m.helper_pid), (Backend::SwPoolTree, 4242));
    let mpd = mp.display().to_string();
    let s = spawned(&sys);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].0, Tool::ChunkServer);
    assert_eq!(
        s[0].1,
        [
            "--tree",
            "--cached",
            "--pool",
            "/pools/demo.sqfs",
            "--digest",
            "blake3:cd",
            "--dir",
            mpd.as_str()
        ]
    );
    assert!(any(&sys, |c| matches!(c, Call::Release(4242))));
    // its mount is sw-pool's: stale when the server dies, unmounted like any other
    sys.script.lock().unwrap().stale.push(mp.clone());
    assert_eq!(state(&sys, &sys.mount_table(), &mp), MountState::Stale);
    let u = unmount(&sys, &mp, true).unwrap();
    assert!(u.was_stale);
    assert_eq!(state(&sys, &sys.mount_table(), &mp), MountState::Absent);
}

#[test]
fn an_image_the_tree_server_refuses_is_mounted_with_squashfuse_ll() {
    let (_d, mp, sys) = setup(FakeHelper::Refuses(
        Tool::ChunkServer,
        3,
        "sw-pool-serve: demo: unsupported compressor lzo".into(),
    ));
    let img = pool_image().with_reader(FuseReader::SwPool);
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.backend, Backend::SquashfuseLl);
    let tools: Vec<Tool> = spawned(&sys).into_iter().map(|s| s.0).collect();
    assert_eq!(tools, [Tool::ChunkServer, Tool::SquashfuseLl]);
    assert_eq!(state(&sys, &sys.mount_table(), &mp), MountState::Mounted);
}

#[test]
fn another_failure_of_the_tree_server_is_reported_not_hidden_by_a_fallback() {
    let (_d, mp, sys) = setup(FakeHelper::Refuses(
        Tool::ChunkServer,
        1,
        "sw-pool-serve: demo: bad inode table".into(),
    ));
    let img = pool_image().with_reader(FuseReader::SwPool);
    let e = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(
        e.to_string().contains("sw-pool-serve") && e.to_string().contains("bad inode table"),
        "{e}"
    );
    assert_eq!(spawned(&sys).len(), 1);
}

#[test]
fn without_sw_pool_serve_installed_a_cached_pool_is_mounted_with_squashfuse_ll() {
    let (_d, mp, sys) = setup(FakeHelper::Missing(Tool::ChunkServer));
    let img = pool_image().with_reader(FuseReader::SwPool);
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.backend, Backend::SquashfuseLl);
    let tools: Vec<Tool> = spawned(&sys).into_iter().map(|s| s.0).collect();
    assert_eq!(tools, [Tool::ChunkServer, Tool::SquashfuseLl]);
    // in place it is needed either way: the error names it
    let (_d, mp, sys) = setup(FakeHelper::Missing(Tool::ChunkServer));
    let img = served_pool().with_reader(FuseReader::SwPool);
    let e = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("sw-pool-serve"), "{e}");
}
