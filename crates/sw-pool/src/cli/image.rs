//! `sw-pool image`: writable user images.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool image create --small-files data.img ~/dataset
      an ext4 image of ~/dataset, twice its size, tuned for many small files
  sw-pool mount --rw data.img ~/mnt/data
      read-write on this node (one node at a time; read-only on any number)
  sw-pool image resize data.img 20G
  sw-pool image check data.img

The lease beside the image (IMG.lease) says who holds it; a holder whose job
ended or whose node rebooted is taken over, a live one is named in the refusal.")]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Make a sparse ext4 image, empty or filled from a directory (sized from it)
    Create {
        /// Image size (coreutils units: 10G, 500MB); default: SRC's contents × --oversize
        #[arg(short, long, value_name = "SIZE", conflicts_with = "oversize")]
        size: Option<String>,
        /// How much larger than SRC's contents to make it (default 2)
        #[arg(long, value_name = "FACTOR")]
        oversize: Option<f64>,
        /// Number of inodes (files and directories it can hold)
        #[arg(long, value_name = "N", conflicts_with = "small_files")]
        inodes: Option<u64>,
        /// Tune for many small files (mke2fs -T small: 1 KiB blocks, an inode per 4 KiB)
        #[arg(long)]
        small_files: bool,
        /// Replace IMG if it exists
        #[arg(short, long)]
        force: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
        /// The image file to make
        image: PathBuf,
        /// A directory whose contents fill the image
        src: Option<PathBuf>,
    },
    /// Grow or shrink an image offline (refused while any node has it mounted)
    Resize {
        /// The image file
        image: PathBuf,
        /// The new size (coreutils units)
        size: String,
    },
    /// Check an image's file system (e2fsck); --repair fixes what is safe to fix
    Check {
        /// Repair (e2fsck -p), under the exclusive lease
        #[arg(long)]
        repair: bool,
        /// The image file
        image: PathBuf,
    },
}
