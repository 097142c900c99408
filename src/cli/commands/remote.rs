//! `ckpt remote add NAME URL [--endpoint URL] [--region R] [--allow-http] [--layout
//! mirror|deltas]`, `ckpt remote remove NAME`, `ckpt remote [-v]`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::Result;
use ckpt::remote::S3Options;
use std::path::Path;

/// Object-store settings given on the command line (`remote add`, `clone`); credentials come
/// only from the environment, so they never reach a config file or a process list.
#[derive(clap::Args, Debug)]
pub struct S3Args {
    /// Endpoint URL (S3: default AWS_ENDPOINT_URL, else AWS; GCS: the API's base URL, default
    /// STORAGE_EMULATOR_HOST, else Google; Azure: the account's blob service URL).
    #[arg(long)]
    endpoint: Option<String>,
    /// S3 region (default: AWS_REGION; S3 only).
    #[arg(long)]
    region: Option<String>,
    /// Allow plain HTTP to the endpoint (a local server; default: AWS_ALLOW_HTTP).
    #[arg(long)]
    allow_http: bool,
}

impl From<S3Args> for S3Options {
    fn from(a: S3Args) -> S3Options {
        S3Options { endpoint: a.endpoint, region: a.region, allow_http: a.allow_http }
    }
}

/// Arguments of `ckpt remote`.
#[derive(clap::Args, Debug)]
pub struct RemoteArgs {
    /// Show each remote's URL and settings (never credentials: user information and query
    /// values in a URL are shown as ***).
    #[arg(short, long)]
    verbose: bool,
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Add a remote: a directory (path or file:///path), s3://BUCKET/PREFIX, gs://BUCKET/PREFIX
    /// (Google Cloud Storage) or az://CONTAINER/PREFIX (Azure Blob Storage).
    Add {
        /// Its name (`origin` is the default of push, fetch and pull).
        name: String,
        /// Where it is.
        url: String,
        #[command(flatten)]
        s3: S3Args,
        /// How the remote stores versions: `mirror` keeps the newest version of each branch
        /// whole there (older ones as reverse deltas), so reading the latest downloads one
        /// checkpoint; `deltas` uploads forward deltas and never replaces an object, the
        /// least upload for pushers on a thin uplink.
        #[arg(long, default_value = "mirror")]
        layout: ckpt::sync::Layout,
    },
    /// Remove a remote and its remote-tracking branches.
    Remove {
        /// Its name.
        name: String,
    },
}

/// Runs `ckpt remote`.
pub fn run(ui: &Ui, base: &Path, args: RemoteArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    match args.action {
        Some(Action::Add { name, url, s3, layout }) => {
            // A relative directory remote is relative to where the command runs (`-C` included),
            // and stored absolute.
            ckpt::remote::check_no_secrets(&url)?;
            ckpt::sync::add_remote(&repo, &name, &ckpt::sync::absolute_dir_url(&url, base), s3.into(), layout)?;
        }
        Some(Action::Remove { name }) => ckpt::sync::remove_remote(&repo, &name)?,
        None => {
            for (name, config) in ckpt::sync::remotes(&repo)? {
                if !args.verbose {
                    outln!("{name}")?;
                    continue;
                }
                let mut extra = vec![format!("layout={}", config.layout)];
                if let Some(e) = &config.s3.endpoint {
                    extra.push(format!("endpoint={}", ckpt::remote::redact_url(e)));
                }
                if let Some(r) = &config.s3.region {
                    extra.push(format!("region={r}"));
                }
                if config.s3.allow_http {
                    extra.push("allow-http".to_string());
                }
                let extra = if extra.is_empty() { String::new() } else { format!(" ({})", extra.join(", ")) };
                // Never a secret, even from a file written before they were refused.
                outln!("{name}\t{}{extra}", ckpt::remote::redact_url(&config.url))?;
            }
        }
    }
    Ok(())
}
