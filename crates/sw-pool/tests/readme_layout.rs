//! The README as a newcomer reads it (issue 52, point 4): the first screenful says how to set up
//! (`make demo`, `make test`), what sw-pool is, how to install it (requirements listed) and the quick
//! start; a table of contents links every part of the user guide, the admin guide and the
//! reference; every link inside the README lands on a heading; the exit-status table is the one
//! `sw-pool --help` prints; and nothing in the project numbers the sittings it was written in
//! (name a date, a commit or a results file instead).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).unwrap()
}

/// The README's lines outside fenced code blocks, with their line numbers (1-based).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, l) in text.lines().enumerate() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, l));
        }
    }
    out
}

/// `(level, title, line)` of every Markdown heading.
fn headings(text: &str) -> Vec<(usize, String, usize)> {
    prose(text)
        .into_iter()
        .filter_map(|(n, l)| {
            let level = l.chars().take_while(|&c| c == '#').count();
            (level > 0 && l[level..].starts_with(' '))
                .then(|| (level, l[level..].trim().to_string(), n))
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every `](#anchor)` link target of a text.
fn anchors(text: &str) -> Vec<String> {
    text.split("](#")
        .skip(1)
        .filter_map(|rest| rest.split(')').next().map(str::to_string))
        .collect()
}

#[test]
fn the_first_screenful_says_how_to_set_up_what_it_is_how_to_install_it_and_the_quick_start() {
    let text = readme();
    let lines: Vec<&str> = text.lines().collect();
    const SCREEN: usize = 60;
    let first = lines[..SCREEN.min(lines.len())].join("\n");
    // the project's rule: the README opens with the two commands that do all set-up
    let opening: String = lines
        .iter()
        .take(10)
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    for cmd in ["make demo", "make test"] {
        assert!(
            opening.contains(cmd),
            "the README's first 10 lines name `{cmd}`:\n{opening}"
        );
    }
    for (what, needle) in [
        ("what sw-pool is", "pool"),
        ("an install section", "\n## Install"),
        ("the requirements", "Requirements"),
        ("the Debian packages it needs", "squashfuse"),
        ("the install command", "make install"),
        ("the Debian package", "make deb"),
        ("the quick start", "<!-- example: quickstart -->"),
    ] {
        assert!(
            first.contains(needle),
            "the first {SCREEN} lines give {what} ({needle:?})"
        );
    }
    let quick = lines
        .iter()
        .position(|l| l.contains("example: quickstart"))
        .unwrap();
    let end = (quick + 2..lines.len())
        .find(|&i| lines[i].starts_with("```"))
        .unwrap();
    assert!(
        end < SCREEN,
        "the quick start ends at line {}, after the first screenful ({SCREEN} lines)",
        end + 1
    );
}

#[test]
fn a_table_of_contents_links_the_user_guide_the_admin_guide_and_the_reference() {
    let text = readme();
    let heads = headings(&text);
    let line_of = |title: &str| {
        heads
            .iter()
            .find(|(_, t, _)| t == title)
            .map(|h| h.2)
            .unwrap_or_else(|| panic!("the README has no heading {title:?}: {heads:?}"))
    };
    let contents = line_of("Contents");
    let user = line_of("User guide");
    let admin = line_of("Admin guide");
    let reference = line_of("Reference");
    assert!(
        contents < user && user < admin && admin < reference,
        "Contents ({contents}), User guide ({user}), Admin guide ({admin}), Reference ({reference}) in this order"
    );
    for part in ["User guide", "Admin guide", "Reference"] {
        assert_eq!(
            heads.iter().find(|(_, t, _)| t == part).unwrap().0,
            1,
            "{part} is a part (#)"
        );
    }
    // the table of contents: the lines between its heading and the next heading
    let toc: String = text
        .lines()
        .skip(contents)
        .take_while(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let listed = anchors(&toc);
    for (level, title, n) in &heads {
        if *n > user && *level <= 2 {
            assert!(
                listed.contains(&slug(title)),
                "the table of contents links {title:?} (line {n}, #{})",
                slug(title)
            );
        }
    }
}

#[test]
fn every_link_inside_the_readme_lands_on_a_heading() {
    let text = readme();
    let slugs: Vec<String> = headings(&text).iter().map(|h| slug(&h.1)).collect();
    let links = anchors(&text);
    assert!(links.len() >= 10, "{links:?}");
    for a in links {
        assert!(
            slugs.contains(&a),
            "README links #{a}, which no heading makes: {slugs:?}"
        );
    }
}

#[test]
fn the_papers_command_lines_stay_as_written() {
    let text = readme();
    for l in [
        "sw-pool build -s 1020MB test-pool.ext2 test-pool",
        "mpirun sw-pool -v load -m $LOCAL_TMPDIR/mnt $SCRATCH/random.ext2",
    ] {
        assert!(
            text.lines().any(|x| x == l),
            "the README has the paper's line {l:?}"
        );
    }
}

/// Words of a table cell or help line, without Markdown and punctuation.
fn words(s: &str) -> Vec<String> {
    s.split(|c: char| c.is_whitespace() || "()`:,".contains(c))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_exit_status_table_is_the_one_sw_pool_help_prints() {
    let text = readme();
    let o = run(Command::new(bin()).arg("--help"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let help = o
        .stdout
        .split("EXIT STATUS:")
        .nth(1)
        .expect("--help has EXIT STATUS");
    let rows: Vec<(String, String)> = text
        .split("## Exit status")
        .nth(1)
        .expect("the README has an Exit status section")
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() == 4 && cells[1].parse::<u8>().is_ok())
                .then(|| (cells[1].to_string(), cells[2].to_string()))
        })
        .collect();
    assert_eq!(rows.len(), 9, "statuses 0 to 8: {rows:?}");
    for (status, meaning) in rows {
        let line = help
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&status))
            .unwrap_or_else(|| panic!("--help lists status {status}:\n{help}"));
        let said = words(line.trim_start().trim_start_matches(status.as_str()));
        let row = words(&meaning);
        assert!(
            said.starts_with(&row),
            "README's exit status {status} ({meaning:?}) is not what --help says ({:?})",
            line.trim()
        );
    }
}

/// Text files of the repository (not `target/`, `.git/`, fuzzing's work directories).
fn project_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            if ![".git", "target", "corpus", "artifacts", "coverage"].contains(&name.as_str()) {
                project_files(&p, out);
            }
        } else if ft.is_file() {
            out.push(p);
        }
    }
}

#[test]
fn nothing_in_the_project_numbers_its_sittings() {
    let root = repo().canonicalize().unwrap();
    let mut files = Vec::new();
    project_files(&root, &mut files);
    assert!(files.len() > 100, "{} files", files.len());
    let word = ["sess", "ion "].concat();
    let mut found = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue; // not text
        };
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let hit = lower.match_indices(&word).any(|(i, _)| {
                lower[i + word.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            });
            if hit {
                found.push(format!(
                    "{}:{}: {}",
                    f.strip_prefix(&root).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "name a date, a commit or a results file instead:\n{}",
        found.join("\n")
    );
}
