//! Which files a bundle leaves out (`--exclude` globs and the system's own libraries).

use super::*;

/// Simple glob: `*` matches any run of characters.
pub fn glob_match(pat: &str, s: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == s;
    }
    let mut rest = s;
    for (k, part) in parts.iter().enumerate() {
        if k == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if k == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
    }
    true
}

pub(super) struct Excludes {
    pub(super) rules: Vec<(String, String)>,
    pub(super) include: Vec<String>,
}

impl Excludes {
    pub(super) fn new(o: &BundleOptions) -> Excludes {
        let mut rules: Vec<(String, String)> = Vec::new();
        if !o.no_default_excludes {
            rules.extend(
                DEFAULT_EXCLUDES
                    .iter()
                    .map(|(p, r)| (p.to_string(), r.to_string())),
            );
        }
        for p in &o.exclude {
            rules.push((p.clone(), format!("excluded by --exclude {p}")));
        }
        Excludes {
            rules,
            include: o.include.clone(),
        }
    }
    /// The reason `names` (the needed name, the soname, the file name) are excluded, if they are.
    pub(super) fn reason(&self, names: &[&str]) -> Option<String> {
        if names
            .iter()
            .any(|n| self.include.iter().any(|p| glob_match(p, n)))
        {
            return None;
        }
        for (p, r) in &self.rules {
            if let Some(n) = names.iter().find(|n| glob_match(p, n)) {
                return Some(format!("{r} ({n} matches {p})"));
            }
        }
        None
    }
}
