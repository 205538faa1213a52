//! Paths in messages.

use std::path::Path;

/// A path for a message: control characters (a newline, an escape sequence) are shown escaped
/// (`\n`, `\x1b`), so a hostile name cannot split an error over lines or drive the terminal.
pub fn show(p: &Path) -> Shown<'_> {
    Shown(p)
}

/// See [`show`].
pub struct Shown<'a>(&'a Path);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for c in self.0.to_string_lossy().chars() {
            if c.is_control() {
                for e in c.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod show_tests {
    #[test]
    fn escapes_control_characters_only() {
        let p = std::path::Path::new("/tmp/a\nb\x1b[31mc d/é");
        assert_eq!(super::show(p).to_string(), "/tmp/a\\nb\\u{1b}[31mc d/é");
    }
}
