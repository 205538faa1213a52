use swpool_core::config::Environment;
use swpool_core::image::SpecialKind;
use swpool_core::size::Bytes;
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, InspectArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: InspectArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let found = swpool_core::inspect::inspect(&a.pool, !a.no_check, env.path_var())?;
    let (pool, fsck, special) = (&found.pool, &found.fsck, &found.special);
    let m = &pool.manifest;
    p.result(format!("pool      {}/{}", m.name, m.version));
    if let Some(d) = &m.description {
        p.result(format!("about     {d}"));
    }
    p.result(format!(
        "file      {} ({} bytes)",
        a.pool.display(),
        pool.file_len
    ));
    p.result(format!("format    {}", m.format));
    p.result(format!(
        "image     {} ({} bytes)",
        Bytes(m.image_size),
        m.image_size
    ));
    p.result(format!(
        "data      {} in {} of {} chunks of {}",
        Bytes(m.data_size),
        m.chunks.iter().filter(|c| c.is_some()).count(),
        m.chunks.len(),
        Bytes(m.chunk_size)
    ));
    p.result(format!("digest    {}", m.digest));
    p.result(format!(
        "signed    {}",
        if pool.signature.is_empty() {
            "no"
        } else {
            "yes"
        }
    ));
    p.result(format!(
        "built     {} at {} (epoch {})",
        m.builder,
        swpool_core::pool::manifest::utc(m.created as i64),
        m.created
    ));
    if m.packages.is_empty() {
        p.result("packages  none (an ad-hoc pool without install/)");
    } else {
        p.result(format!("packages  {}", m.packages.len()));
        for pk in &m.packages {
            p.result(format!(
                "  {}/{}{}",
                pk.name,
                pk.version,
                if pk.modulefile {
                    ""
                } else {
                    "  (no modulefile)"
                }
            ));
        }
    }
    match special {
        Ok(v) if v.is_empty() => {
            p.result("special   none (no setuid/setgid files, no device nodes)")
        }
        Ok(v) => {
            p.result(format!(
                "special   {} setuid/setgid file(s) or device node(s):",
                v.len()
            ));
            for s in v {
                p.result(format!("  {}", s.describe()));
            }
        }
        Err(e) => p.result(format!("special   not read: {e}")),
    }
    if let Some(c) = &fsck {
        p.result(format!(
            "check     {} ({})",
            if c.ok { "ok" } else { "FAILED" },
            c.tool
        ));
        p.verbose(
            c.summary
                .lines()
                .map(|l| format!("          {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    p.json(&serde_json::json!({
        "path": a.pool,
        "file_size": pool.file_len,
        "signed": !pool.signature.is_empty(),
        "manifest": m,
        "check": fsck,
        "special": match special {
            Ok(v) => serde_json::json!(v.iter().map(|s| serde_json::json!({
                "path": s.path,
                "kind": match s.kind {
                    SpecialKind::SetId => "setid",
                    SpecialKind::CharDevice { .. } => "char-device",
                    SpecialKind::BlockDevice { .. } => "block-device",
                },
                "mode": format!("{:o}", s.mode),
                "device": match s.kind {
                    SpecialKind::CharDevice { major, minor } | SpecialKind::BlockDevice { major, minor } => Some([major, minor]),
                    SpecialKind::SetId => None,
                },
            })).collect::<Vec<_>>()),
            Err(e) => serde_json::json!({"error": e}),
        },
    }));
    if let Some(c) = fsck {
        if !c.ok {
            return Err(Error::other(
                ExitStatus::InvalidPool,
                format!(
                    "{}: file-system check failed ({}):\n  {}",
                    a.pool.display(),
                    c.tool,
                    c.summary.replace('\n', "\n  ")
                ),
            ));
        }
    }
    Ok(())
}
