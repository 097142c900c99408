//! `ckpt verify`: exits non-zero when anything is damaged.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt verify`.
pub fn run(ui: &Ui, base: &Path, args: VerifyArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let r = repo.verify()?;
    if args.json {
        crate::cli::ui::print_json(&r)?;
    } else {
        for o in &r.bad_objects {
            outln!("bad object {}: {}", o.id, crate::cli::ui::printable(&o.problem))?;
        }
        for v in &r.bad_versions {
            let ids: Vec<String> = v.objects.iter().map(|o| o.short(12)).collect();
            outln!(
                "bad version {} (reached from {}): needs damaged or missing {}",
                v.id,
                v.reached_from,
                ids.join(", ")
            )?;
        }
        for line in &r.bad_refs {
            outln!("bad ref: {}", crate::cli::ui::printable(line))?;
        }
        outln!(
            "checked {} objects ({}) and {} versions",
            r.objects_checked,
            bytes(r.bytes_checked),
            r.versions_checked
        )?;
    }
    anyhow::ensure!(
        r.is_ok(),
        "verification failed: {} bad objects, {} affected versions, {} bad refs",
        r.bad_objects.len(),
        r.bad_versions.len(),
        r.bad_refs.len()
    );
    Ok(())
}
