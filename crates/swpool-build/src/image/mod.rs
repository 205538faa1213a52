//! Images: file-system formats, detecting them from their magic, and building them.

mod build;
pub mod check;
mod defuse;
mod ext_times;
pub mod special;
mod tree;

pub use build::{build, ext_min_size, BuildError, BuildOptions, BuildReport, Timings};
pub use tree::{scan as scan_tree, Special, SpecialKind, TreeError, TreeStats};

pub use swpool_format::format::{detect, detect_bytes, DetectError, ImageFormat};
