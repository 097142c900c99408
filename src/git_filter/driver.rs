//! clean and smudge: a file's content to its pointer (storing the content in the ckpt store),
//! and a pointer back to the content, verified.
//!
//! clean spools its input to a temporary file in the store's `tmp/` (git gives the content as
//! a stream; the store codes a mapped file, tensor by tensor, with bounded memory) and stores
//! it with [`Repo::store_file`]: content the store already holds costs one hash pass and writes
//! nothing. smudge writes the file from the store into a temporary file, where every segment
//! and the file hash are verified, and only then sends it: git never receives a byte of a file
//! that does not verify.

use super::pointer::{self, Pointer};
use super::process::{Command, Filter};
use super::{Error, Result};
use crate::repo::{CommitOptions, Manifest, Repo, RepoPath};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Buffer size for copying content between pipes and files.
const COPY_BUF: usize = 1 << 20;

/// How many of the files a filter process stored last a master stored after them may be the
/// source of ([`GitFilter::cleaned`]): bounds the manifests each clean reads.
const COPIES_KEPT: usize = 16;

/// The most bytes read of a manifest on the ckpt remote when checking that it is there.
const MAX_REMOTE_MANIFEST: u64 = 1 << 30;

/// The filter of one git repository: its ckpt store, and stores to read from when an object
/// is not there (the store of a local `origin`).
pub struct GitFilter {
    store: Repo,
    fallbacks: Vec<Repo>,
    options: CommitOptions,
    skip_smudge: bool,
    remote: Option<RemoteSource>,
    /// What git said about the current request (filter-process only).
    request: super::process::RequestMeta,
    /// The manifests of files stored beside the next clean's: those cleaned earlier by this
    /// process, newest first, then those of git's `HEAD` (read at the first clean). Their F32
    /// tensors predict its BF16 and F16 ones ([`Repo::store_file_beside`]), as `ckpt commit`
    /// predicts them from another file of one commit.
    beside: std::sync::Mutex<Option<Vec<crate::object_id::ObjectId>>>,
    /// The newest files this process stored ([`COPIES_KEPT`]): a master stored later may be the
    /// source of their narrow tensors ([`Repo::derive_copies_from`]).
    copies: std::sync::Mutex<Vec<crate::repo::StoredCopy>>,
    /// A store in the own store's `tmp/` for files fetched from the ckpt remote only to be
    /// read (a diff), dropped with the filter.
    scratch: std::sync::OnceLock<std::result::Result<(tempfile::TempDir, Repo), Arc<Error>>>,
}

/// The ckpt remote a filter fetches missing objects from, opened on first use (most smudges
/// never need it).
struct RemoteSource {
    url: String,
    opened: std::sync::OnceLock<std::result::Result<Box<dyn crate::remote::Remote>, Arc<Error>>>,
}

impl RemoteSource {
    /// The remote, opened on first use (an error to open it is kept and given to every caller).
    fn get(&self) -> Result<&dyn crate::remote::Remote> {
        let opened = self.opened.get_or_init(|| {
            super::ckpt_remote::open(&self.url)
                .map_err(|e| Arc::new(Error::RemoteOpen { url: self.url.clone(), source: Box::new(e) }))
        });
        opened.as_deref().map_err(|e| Error::Shared(e.clone()))
    }
}

impl GitFilter {
    /// A filter storing into `store` with `options` (whether deltas are deferred, see
    /// [`CommitOptions::defer_deltas`]), reading missing objects from `fallbacks` in order.
    pub fn new(store: Repo, fallbacks: Vec<Repo>, options: CommitOptions) -> GitFilter {
        GitFilter {
            store,
            fallbacks,
            options,
            skip_smudge: false,
            remote: None,
            request: Default::default(),
            beside: std::sync::Mutex::new(None),
            copies: std::sync::Mutex::new(Vec::new()),
            scratch: std::sync::OnceLock::new(),
        }
    }

    /// The manifests of files stored beside the next clean's (see `GitFilter::beside`). A
    /// `HEAD` that cannot be read (not in a git repository: a one-shot clean from elsewhere)
    /// offers none: it only costs a reference.
    fn beside(&self) -> Vec<crate::object_id::ObjectId> {
        let mut beside = self.beside.lock().unwrap_or_else(|e| e.into_inner());
        let list = beside.get_or_insert_with(|| {
            let head = git2::Repository::open_from_env().ok().and_then(|git| super::history::head_pointers(&git).ok());
            head.unwrap_or_default().into_iter().map(|(_, p)| p.manifest).collect()
        });
        list.clone()
    }

    /// Records a file this process stored at `path`: the newest of the files beside the next
    /// clean's; and, as a master, the source of the narrow tensors of the files stored before
    /// it (git cleans in path order, so a bf16 copy often comes first). A failure there costs
    /// only bytes: it is said on stderr.
    fn cleaned(&self, path: &str, stored: &crate::repo::StoredFile) {
        let mut beside = self.beside.lock().unwrap_or_else(|e| e.into_inner());
        let list = beside.get_or_insert_with(Vec::new);
        list.retain(|m| *m != stored.manifest);
        list.insert(0, stored.manifest);
        drop(beside);
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.store.derive_copies_from(&copies, &stored.manifest) {
            eprintln!("ckpt: {path}: its bf16/f16 copies stored before it stay whole: {e}");
        }
        if let Some(version) = stored.version {
            copies.insert(0, crate::repo::StoredCopy { manifest: stored.manifest, version, path: path.to_string() });
            copies.truncate(COPIES_KEPT);
        }
    }

    /// Fetches objects the stores lack from the ckpt remote at `url` (see
    /// [`super::ckpt_remote`]), verified before they enter the own store.
    pub fn set_remote(&mut self, url: Option<String>) {
        self.remote = url.map(|url| RemoteSource { url, opened: std::sync::OnceLock::new() });
    }

    /// Downloads `p`'s file from the ckpt remote into `into` (the own store, or the scratch
    /// store); `None` without a remote.
    fn fetch_from_remote(&self, p: &Pointer, into: &Repo) -> Option<Result<()>> {
        let source = self.remote.as_ref()?;
        Some(source.get().and_then(|remote| {
            crate::sync::fetch_file(into, remote, &p.manifest).map(|_| ()).map_err(|source_error| Error::RemoteFetch {
                hash: p.hash,
                manifest: p.manifest,
                url: source.url.clone(),
                source: Box::new(source_error),
            })
        }))
    }

    /// The scratch store (created on first use).
    fn scratch(&self) -> Result<&Repo> {
        let made = self.scratch.get_or_init(|| {
            let tmp_dir = self.store.ckpt_dir().join("tmp");
            let dir = tempfile::Builder::new().prefix("git-read-").tempdir_in(&tmp_dir).map_err(|source| {
                Arc::new(Error::Io { action: "creating a directory in", path: tmp_dir.clone(), source })
            })?;
            let repo = Repo::init(dir.path()).map_err(|e| Arc::new(Error::Scratch(Box::new(e))))?;
            Ok((dir, repo))
        });
        made.as_ref().map(|(_, r)| r).map_err(|e| Error::Shared(e.clone()))
    }

    /// Whether the current smudge writes the working tree, so that what it needs from
    /// another store is kept in the own one (docs/format.md, "The git filter's store: who it
    /// keeps objects for"): a checkout of a commit names its `treeish` or `ref`; a request
    /// without any metadata (a one-shot smudge, `ckpt git checkout`, git before 2.27) counts
    /// as a checkout; a request naming only a `blob` is a checkout from the index (`git
    /// checkout -- path`) when that blob is staged at `path`, and otherwise a read for `git
    /// diff`, `git log -p` or `git show`, which must not grow the store.
    fn smudge_keeps(&self, path: &str) -> bool {
        let m = &self.request;
        let Some(blob) = m.blob.as_deref().filter(|_| m.treeish.is_none() && m.reference.is_none()) else {
            return true;
        };
        let staged = || -> Option<bool> {
            let git = git2::Repository::open_from_env().ok()?;
            let entry = git.index().ok()?.get_path(Path::new(path), 0)?;
            Some(entry.id.to_string() == blob)
        };
        staged().unwrap_or(true)
    }

    /// With `skip`, smudge leaves valid pointers as they are (`CKPT_SKIP_SMUDGE=1`); `ckpt git
    /// checkout` writes the files later.
    pub fn set_skip_smudge(&mut self, skip: bool) {
        self.skip_smudge = skip;
    }

    /// The store written to.
    pub fn store(&self) -> &Repo {
        &self.store
    }

    /// clean: `input` (the content of `path`) → its pointer on `output`. A valid pointer is
    /// returned unchanged if the file it names can be checked out (see
    /// [`GitFilter::check_restorable`]), and is an error otherwise: git never commits a pointer
    /// that fails only at checkout.
    pub fn clean(&self, path: &str, input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
        let mut head = Vec::with_capacity(pointer::MAX_LEN + 1);
        input.take(pointer::MAX_LEN as u64 + 1).read_to_end(&mut head).map_err(stream("reading from git"))?;
        if head.len() <= pointer::MAX_LEN {
            if let Ok(p) = Pointer::parse(&head) {
                // Already a pointer (a checkout whose smudge was skipped, or a pointer committed
                // on purpose): storing it as content would hide the weights behind a pointer to
                // a pointer. Passed through only if its file exists somewhere ckpt reads from.
                self.check_restorable(&p)?;
                return output.write_all(&head).map_err(stream("writing to git"));
            }
        }
        let rp = RepoPath::parse(path).map_err(|reason| Error::StorePath { path: path.to_string(), reason })?;
        let tmp_dir = self.store.ckpt_dir().join("tmp");
        let spool = tempfile::Builder::new()
            .prefix("git-clean-")
            .tempfile_in(&tmp_dir)
            .map_err(|source| Error::Io { action: "creating a file in", path: tmp_dir.clone(), source })?;
        {
            let mut w = io::BufWriter::with_capacity(COPY_BUF, spool.as_file());
            let spool_err = |action| {
                let path = spool.path().to_path_buf();
                move |source| Error::Io { action, path, source }
            };
            w.write_all(&head).map_err(spool_err("writing"))?;
            io::copy(input, &mut w).map_err(spool_err("spooling the content to"))?;
            w.flush().map_err(spool_err("writing"))?;
        }
        let beside = self.beside();
        let stored = self
            .store
            .store_file_beside(spool.path(), &rp, (&format!("git clean {path}"), &self.options), &beside)
            .map_err(|e| Error::Store { store: self.store.root().to_path_buf(), source: Box::new(e) })?;
        self.cleaned(path, &stored);
        let p = Pointer::new(stored.hash, stored.manifest, stored.len);
        output.write_all(&p.to_bytes()).map_err(stream("writing to git"))
    }

    /// Whether the file `p` names can be checked out here: its manifest (with the same size
    /// and hash) and every blob it lists are in the own store or a fallback store, or the ckpt
    /// remote holds its manifest (pushes upload a file's objects before its manifest). The
    /// error says where ckpt looked.
    pub fn check_restorable(&self, p: &Pointer) -> Result<()> {
        let mut notes = Vec::new();
        for store in std::iter::once(&self.store).chain(&self.fallbacks) {
            if !store.store().contains(&p.manifest) {
                continue;
            }
            match store.manifest(&p.manifest) {
                Ok(m) if m.len != p.size || m.hash != p.hash => notes.push(format!(
                    "the ckpt store at {} has manifest {} for a file of {} bytes with hash {}, not the pointer's",
                    store.root().display(),
                    p.manifest,
                    m.len,
                    m.hash
                )),
                Ok(m) => match m.blobs().find(|b| !store.store().contains(b)) {
                    None => return Ok(()),
                    Some(b) => notes.push(format!("the ckpt store at {} lacks its blob {b}", store.root().display())),
                },
                Err(e) => notes.push(format!("the ckpt store at {}: {e}", store.root().display())),
            }
        }
        match &self.remote {
            None => notes.push("no ckpt remote is configured".to_string()),
            Some(source) => match source.get() {
                Ok(remote) => {
                    let key = crate::remote::object_key(&p.manifest);
                    match remote.download(&key, &mut io::sink(), MAX_REMOTE_MANIFEST) {
                        Ok(_) => return Ok(()),
                        Err(crate::remote::Error::NotFound { .. }) => {
                            notes.push(format!("the ckpt remote {} does not have it", source.url))
                        }
                        Err(e) => notes.push(format!("asking the ckpt remote {}: {e}", source.url)),
                    }
                }
                Err(e) => notes.push(e.to_string()),
            },
        }
        Err(Error::NotRestorable { manifest: p.manifest, size: p.size, store: self.store.root().to_path_buf(), notes })
    }

    /// smudge: `input` (what git stores for the file at `path`) → the file on `output`. Content that does
    /// not start like a ckpt pointer (committed before the path was tracked) passes through
    /// unchanged; a malformed ckpt pointer, or one whose objects are missing or damaged, is an
    /// error before any byte is sent.
    pub fn smudge(&self, path: &str, input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
        let mut head = Vec::with_capacity(pointer::MAX_LEN + 1);
        input.take(pointer::MAX_LEN as u64 + 1).read_to_end(&mut head).map_err(stream("reading from git"))?;
        if !head.starts_with(pointer::PREFIX) {
            output.write_all(&head).map_err(stream("writing to git"))?;
            return io::copy(input, output).map(|_| ()).map_err(stream("passing content through"));
        }
        let p = Pointer::parse(&head).map_err(Error::InvalidPointer)?;
        if self.skip_smudge {
            return output.write_all(&head).map_err(stream("writing to git"));
        }
        let tmp_dir = self.store.ckpt_dir().join("tmp");
        let dir = tempfile::Builder::new().prefix("git-smudge-").tempdir_in(&tmp_dir).map_err(|source| Error::Io {
            action: "creating a directory in",
            path: tmp_dir.clone(),
            source,
        })?;
        let file = dir.path().join("file");
        self.write_from(&p, &file, &|| self.smudge_keeps(path))?;
        let mut f =
            std::fs::File::open(&file).map_err(|source| Error::Io { action: "opening", path: file.clone(), source })?;
        copy_with_buffer(&mut f, output).map_err(stream("sending the file to git"))
    }

    /// Writes `p`'s file to `dest` (temporary file + rename, verified) from the own store, else
    /// from the first other source that has a good copy: the fallback stores (a local origin's)
    /// in order, then the ckpt remote. What comes from another source is checked object by
    /// object before it lands in the own store, and a damaged copy sends the search on to the
    /// next source; the error, when no source has a good copy, names the file and every
    /// source tried with what was wrong there.
    pub fn write_from_stores(&self, p: &Pointer, dest: &Path) -> Result<()> {
        self.write_from(p, dest, &|| true)
    }

    /// [`Self::write_from_stores`] for a file only read (a diff, a check): what comes from
    /// another source does not enter the own store.
    pub fn read_from_stores(&self, p: &Pointer, dest: &Path) -> Result<()> {
        self.write_from(p, dest, &|| false)
    }

    /// [`Self::write_from_stores`]; when `keep()` says false (asked only when the own store
    /// lacks the file), what is read from elsewhere does not enter the own store (a smudge for
    /// a diff): a fallback store is read in place, a ckpt remote's file goes to the scratch
    /// store.
    fn write_from(&self, p: &Pointer, dest: &Path, keep: &dyn Fn() -> bool) -> Result<()> {
        let own_err = match self.store.write_stored_file(&p.manifest, p.size, &p.hash, dest) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let keep = keep();
        let mut tried = vec![format!("the ckpt store at {}: {own_err}", self.store.root().display())];
        for fallback in &self.fallbacks {
            if !fallback.store().contains(&p.manifest) {
                continue;
            }
            let source = format!("the ckpt store at {}", fallback.root().display());
            let result = if keep {
                // Copied into the own store first (verified), so this clone keeps working
                // without its origin; written from the own store.
                self.store
                    .copy_file_objects_from(fallback, &p.manifest)
                    .and_then(|_| self.store.write_stored_file(&p.manifest, p.size, &p.hash, dest))
            } else {
                fallback.write_stored_file(&p.manifest, p.size, &p.hash, dest)
            };
            match result {
                Ok(_) => return Ok(()),
                Err(e) => tried.push(format!("{source}: {e}")),
            }
        }
        // A file the own store holds whole (a damaged object there) is reported as such, not
        // fetched over it.
        if !self.store.store().contains(&p.manifest) {
            let into = if keep { Ok(&self.store) } else { self.scratch() };
            match into {
                Ok(into) => match self.fetch_from_remote(p, into) {
                    // Written from the store it went to, which checks every object again.
                    Some(Ok(())) => match into.write_stored_file(&p.manifest, p.size, &p.hash, dest) {
                        Ok(_) => return Ok(()),
                        Err(e) => tried.push(format!("the file fetched from the ckpt remote: {e}")),
                    },
                    Some(Err(e)) => tried.push(e.to_string()),
                    None => {
                        tried.push("no ckpt remote is configured (git config ckpt.remote URL, or .ckptconfig)".into())
                    }
                },
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(Error::NoGoodCopy {
            hash: p.hash,
            manifest: p.manifest,
            size: p.size,
            store: self.store.root().to_path_buf(),
            tried: tried.into(),
        })
    }
}

impl GitFilter {
    /// The manifest of the file `p` points to, from the own store or a fallback.
    pub fn manifest(&self, p: &Pointer) -> Result<Manifest> {
        let store = std::iter::once(&self.store).chain(&self.fallbacks).find(|r| r.store().contains(&p.manifest));
        let store = store
            .ok_or_else(|| Error::ManifestMissing { manifest: p.manifest, store: self.store.root().to_path_buf() })?;
        Ok(store.manifest(&p.manifest)?)
    }

    /// The text `git diff` shows for a tracked file (the diff driver's textconv): its size and
    /// hash, then one line per segment: each tensor's name, dtype, shape and blob id (so a
    /// changed tensor is a changed line), headers and gaps as bytes. `file` is either a pointer
    /// (git's side of a diff), whose manifest is read from the store, or the real file (the
    /// working tree's side), which is hashed.
    pub fn textconv(&self, file: &Path) -> Result<String> {
        let small = std::fs::metadata(file).is_ok_and(|m| m.len() <= pointer::MAX_LEN as u64);
        let pointer = if small { std::fs::read(file).ok().and_then(|b| Pointer::parse(&b).ok()) } else { None };
        let manifest = match pointer {
            Some(p) => self.manifest(&p)?,
            None => crate::repo::manifest_of_file(file)?,
        };
        let kind = match manifest.kind {
            crate::repo::FileFormat::Safetensors => "safetensors",
            crate::repo::FileFormat::Torch => "torch.save",
            crate::repo::FileFormat::Distcp => "torch.distributed.checkpoint",
            crate::repo::FileFormat::Bytes => "opaque",
        };
        let mut out = format!("ckpt: {kind} file, {} bytes, hash {}\n", manifest.len, manifest.hash);
        for s in &manifest.segments {
            // A bundled tensor has no id of its own: its line names its bundle's blob, so a
            // change in one small tensor shows on the lines of its bundle's tensors.
            let blob = match (s.blob, s.bundle) {
                (Some(b), _) => b.short(16),
                (None, Some(i)) => match manifest.bundles.get(i as usize) {
                    Some(b) => format!("{} (bundle {i})", b.blob.short(16)),
                    None => format!("(bundle {i})"),
                },
                (None, None) => "-".to_string(),
            };
            match &s.tensor {
                Some(t) => out.push_str(&format!("tensor {} {} {:?} blob {blob}\n", t.name, t.dtype, t.shape)),
                None => out.push_str(&format!("bytes {} blob {blob}\n", s.len)),
            }
        }
        Ok(out)
    }
}

/// An error of git's pipes while `action`.
fn stream(action: &'static str) -> impl Fn(io::Error) -> Error {
    move |source| Error::Stream { action, source }
}

fn copy_with_buffer(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl Filter for GitFilter {
    fn filter(
        &mut self,
        command: Command,
        path: &str,
        input: &mut dyn Read,
        output: &mut dyn Write,
    ) -> std::result::Result<(), super::process::FilterError> {
        let result = match command {
            Command::Clean => self.clean(path, input, output),
            Command::Smudge => self.smudge(path, input, output),
        };
        Ok(result?)
    }

    fn request(&mut self, meta: &super::process::RequestMeta) {
        self.request = meta.clone();
    }
}

/// The ckpt store of `git`'s `origin` remote when that is a local path with a store (so a
/// `git clone /path/to/repo` smudges from the original's objects); `None` otherwise.
pub fn origin_store(git: &git2::Repository) -> Option<Repo> {
    let remote = git.find_remote("origin").ok()?;
    let url = remote.url().ok()?;
    let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
    if url.contains("://") && !url.starts_with("file://") {
        return None;
    }
    let base = git.workdir().unwrap_or_else(|| git.path());
    let origin = git2::Repository::open(base.join(path)).ok()?;
    let root = super::store_root(&origin).ok()?;
    // Only an existing store: a read must not create one in someone else's repository.
    let store = root.join(crate::repo::DIR_NAME).join("HEAD").is_file().then(|| Repo::open(&root).ok()).flatten()?;
    super::with_env_lock_timeout(store).ok()
}
