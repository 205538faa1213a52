//! Prefetch lists: the chunks of one pool a run touched (`sw-pool trace`), warmed in the background
//! by a later on-demand mount of the same pool (`load --lazy --prefetch FILE|auto`), as CVMFS and
//! SOCI do with their prefetch lists.
//!
//! The format is text, one list per pool digest:
//!
//! ```text
//! sw-pool prefetch v1 blake3:<hex> <chunks in the pool>
//! 0-3
//! 17
//! 40-41
//! ```
//!
//! Lines after the header are chunk indices or inclusive ranges, ascending; `#` starts a comment.
//! A list is untrusted input (it may come from anyone's file): it is parsed with bounds (size,
//! lines, indices below the pool's chunk count, ascending) and only ever names chunks, which are
//! verified against the manifest like any other when fetched.

/// Largest list file accepted.
pub const MAX_LIST_BYTES: u64 = 16 << 20;

/// The chunks a prefetch list names for one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchList {
    /// The pool's manifest digest (`blake3:<hex>`).
    pub digest: String,
    /// Chunks in the pool.
    pub total: u64,
    /// The chunks to warm, ascending, each once.
    pub chunks: Vec<u64>,
}

impl PrefetchList {
    /// Parse a list for a pool of `pool_chunks` chunks (see the module's documentation); the error
    /// says what is wrong and on which line. A list made for another pool's chunking is refused,
    /// which also bounds what a list can name; the caller compares the digest.
    pub fn parse(text: &str, pool_chunks: u64) -> Result<PrefetchList, String> {
        if text.len() as u64 > MAX_LIST_BYTES {
            return Err(format!("larger than {MAX_LIST_BYTES} bytes"));
        }
        let mut lines = text.lines().enumerate();
        let (_, head) = lines.next().ok_or("empty")?;
        let f: Vec<&str> = head.split_whitespace().collect();
        const WANT: &str = "sw-pool prefetch v1 DIGEST CHUNKS";
        let (digest, total) = match f.as_slice() {
            ["sw-pool", "prefetch", "v1", d, n] => (*d, *n),
            _ => {
                let got: String = head.chars().take(80).collect();
                return Err(format!(
                    "line 1: not a prefetch list (want `{WANT}`, got `{got}`)"
                ));
            }
        };
        let hex = digest.strip_prefix("blake3:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "line 1: `{digest}` is not a pool digest (blake3:<64 hex digits>)"
            ));
        }
        let total: u64 = total
            .parse()
            .map_err(|_| format!("line 1: `{total}` is not a chunk count"))?;
        if total != pool_chunks {
            return Err(format!(
                "line 1: made for a pool of {total} chunks, this one has {pool_chunks}"
            ));
        }
        let mut chunks = Vec::new();
        let mut next = 0u64; // the smallest index the next line may name
        for (n, line) in lines {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| format!("line {}: {what}: `{line}`", n + 1);
            let num = |s: &str| {
                s.trim()
                    .parse::<u64>()
                    .map_err(|_| bad("not a chunk index"))
            };
            let (a, b) = match line.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let a = num(line)?;
                    (a, a)
                }
            };
            if a > b || b >= total {
                return Err(bad(&format!("not a range of chunks below {total}")));
            }
            if a < next {
                return Err(bad("indices must ascend, each once"));
            }
            chunks.extend(a..=b);
            next = b + 1;
        }
        Ok(PrefetchList {
            digest: digest.to_string(),
            total,
            chunks,
        })
    }

    /// The list as text, runs of chunks as ranges.
    pub fn render(&self) -> String {
        let mut out = format!("sw-pool prefetch v1 {} {}\n", self.digest, self.total);
        let mut i = 0;
        while i < self.chunks.len() {
            let a = self.chunks[i];
            let mut j = i;
            while j + 1 < self.chunks.len() && self.chunks[j + 1] == self.chunks[j] + 1 {
                j += 1;
            }
            match j > i {
                true => out.push_str(&format!("{a}-{}\n", self.chunks[j])),
                false => out.push_str(&format!("{a}\n")),
            }
            i = j + 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "blake3:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn round_trips_with_ranges() {
        let l = PrefetchList {
            digest: D.into(),
            total: 50,
            chunks: vec![0, 1, 2, 3, 17, 40, 41, 49],
        };
        let t = l.render();
        assert_eq!(
            t,
            format!("sw-pool prefetch v1 {D} 50\n0-3\n17\n40-41\n49\n")
        );
        assert_eq!(PrefetchList::parse(&t, 50).unwrap(), l);
        // comments and blank lines are fine
        let t = format!("sw-pool prefetch v1 {D} 50\n# start-up\n0-1  # libc\n\n5\n");
        assert_eq!(PrefetchList::parse(&t, 50).unwrap().chunks, [0, 1, 5]);
    }

    #[test]
    fn hostile_lists_are_refused_with_the_line() {
        let head = format!("sw-pool prefetch v1 {D} 10\n");
        for (body, want) in [
            ("10\n", "line 2"),                              // past the end
            ("3-2\n", "line 2"),                             // backwards
            ("1\n1\n", "line 3"),                            // twice
            ("5\n2\n", "line 3"),                            // not ascending
            ("0-3\n2-4\n", "line 3"),                        // overlapping
            ("x\n", "not a chunk index"),                    // junk
            ("-1\n", "not a chunk index"),                   // negative
            ("18446744073709551616\n", "not a chunk index"), // overflow
        ] {
            let e = PrefetchList::parse(&format!("{head}{body}"), 10).unwrap_err();
            assert!(e.contains(want), "{body:?}: {e}");
        }
        for text in [
            String::new(),
            "hello\n".into(),
            "sw-pool prefetch v2 blake3:00 1\n".into(),
            "sw-pool prefetch v1 sha256:00 1\n".into(),
            format!("sw-pool prefetch v1 {D} many\n"),
        ] {
            assert!(PrefetchList::parse(&text, 1).is_err(), "{text:?}");
        }
        // a huge range is bounded by the pool's own chunk count, not by what the list claims
        let big = format!("sw-pool prefetch v1 {D} 18446744073709551615\n0-18446744073709551614\n");
        let e = PrefetchList::parse(&big, 10).unwrap_err();
        assert!(e.contains("this one has 10"), "{e}");
        let e = PrefetchList::parse(&"x".repeat((MAX_LIST_BYTES + 1) as usize), 10).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
    }
}
