//! Sizes as users write them, with coreutils' units.
//!
//! `K`, `M`, `G`, `T`, `P` and `KiB` … `PiB` are powers of 1024; `KB`, `MB`, `GB`, `TB`, `PB` are powers of
//! 1000 (as `head -c 1GB` and `truncate -s 1020MB` read them). A plain number is bytes; a trailing `B`
//! alone is allowed (`4096B`).

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("invalid size {input:?}: {reason} (examples: 1020MB, 1G, 512MiB, 4096)")]
    Invalid { input: String, reason: &'static str },
}

/// Parse a size such as `1020MB`, `1G`, `512MiB` or `4096` into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let bad = |reason| SizeError::Invalid {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(bad("it must start with a number"));
    }
    let number: u64 = s[..digits_end]
        .parse()
        .map_err(|_| bad("the number is too large"))?;
    let unit = &s[digits_end..];
    let multiplier: u64 = match unit {
        "" | "B" | "c" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "P" | "PiB" => 1 << 50,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        _ => return Err(bad("unknown unit (use K, M, G, T, P, KiB…PiB, or KB…PB)")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| bad("the size is too large"))
}

/// A byte count printed for people: `1.02 GB (1020000000 bytes)` style helpers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut v = self.0 as f64;
        let mut i = 0;
        while v >= 1024.0 && i + 1 < UNITS.len() {
            v /= 1024.0;
            i += 1;
        }
        if i == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[i])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_and_coreutils_units() {
        assert_eq!(parse_size("1020MB"), Ok(1_020_000_000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("8k"), Ok(8192));
        assert_eq!(parse_size("8kB"), Ok(8000));
        assert_eq!(parse_size(" 2T "), Ok(2 << 40));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "MB",
            "-1G",
            "1.5G",
            "1 G",
            "12XB",
            "1Gi",
            "99999999999999999999",
            "20000000PB",
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(e.to_string().contains("invalid size"), "{s}: {e}");
        }
    }

    #[test]
    fn human_bytes() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(1 << 30).to_string(), "1.0 GiB");
    }
}
