//! The job's start, one time for all the nodes of a view's job (see the module's documentation of
//! [`super`]).

/// The start of the job a view serves, the same on all its nodes: a file whose mtime (as the
/// snapshot listed it) is at or after `at` changed after the job began and is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    /// Seconds and nanoseconds since 1970 (a Slurm step's start is whole seconds).
    pub at: (i64, u32),
    /// Where it came from, for messages ("job step 12.0's start").
    pub source: String,
}

impl Epoch {
    /// `SECS[.FRACTION]` since 1970, as `date +%s.%N` prints it.
    pub fn parse(s: &str, source: &str) -> Result<Epoch, String> {
        let bad =
            || format!("{source}={s:?}: give seconds since 1970, as `date +%s.%N` prints them");
        let (secs, frac) = s.trim().split_once('.').unwrap_or((s.trim(), ""));
        if secs.is_empty()
            || !secs.bytes().all(|b| b.is_ascii_digit())
            || frac.len() > 9
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let secs: i64 = secs.parse().map_err(|_| bad())?;
        let nanos: u32 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<9}").parse().map_err(|_| bad())?
        };
        Ok(Epoch {
            at: (secs, nanos),
            source: source.to_string(),
        })
    }
}
