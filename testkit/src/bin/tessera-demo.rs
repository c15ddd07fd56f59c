//! `tessera-demo`: the whole node path in seconds, with no cluster and no GPU. It starts
//! the fake API server and the real plugin on the embedded mock node, and acts as the
//! kubelet over the plugin's real sockets (see `testkit::demo`). A dev tool: it lives in
//! the test kit so that no test double is linked into the shipped `tessera` binary.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "tessera-demo",
    about = "Run the whole node path against a fake API server and the mock node, in seconds"
)]
struct Args {
    /// Keep the demo's temp directory (specs, checkpoint, sockets) for inspection.
    #[arg(long)]
    keep: bool,
    /// The interception library (with its front, shims and CDI hook beside it:
    /// `cargo preload --release`); default: next to the binary.
    #[arg(long)]
    interception_lib: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // The demo prints its own summary; the plugin's logs would only interleave with it.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(demo(args))
}

async fn demo(a: Args) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("tessera-demo-").tempdir()?;
    let mut out = String::new();
    let lib = a
        .interception_lib
        .clone()
        .or_else(tessera::prepare::library::default_source)
        .filter(|p| p.is_file())
        .context(
            "the interception library libtessera_cuda.so is not built next to the binary \
             (`cargo build --release` builds it with every default member, and `cargo \
             preload --release` its front and shims; or pass --interception-lib)",
        )?;
    let result = testkit::demo::run(dir.path(), &lib, &mut out).await;
    print!("{out}");
    let report = result?;
    if !report.leftover_files.is_empty() {
        bail!("files left in the CDI dir: {:?}", report.leftover_files);
    }
    if !report.leftover_claim_dirs.is_empty() {
        bail!("claim directories left: {:?}", report.leftover_claim_dirs);
    }
    if a.keep {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    }
    Ok(())
}
