//! A remote on any `object_store` backend: S3-compatible storage (AWS S3, MinIO, Ceph, R2,
//! s3s-fs), Google Cloud Storage (`gs://`), Azure Blob Storage (`az://`, `azure://`) and, for
//! tests, `object_store`'s in-memory store. One [`StoreRemote`] serves them all: only its
//! builders differ (each cloud's own environment for credentials and emulators). The only
//! module that names `object_store` or tokio (it is still called `s3.rs`, its first backend).
//!
//! `object_store` is async; the [`Remote`] trait is blocking, so each remote owns a small tokio
//! runtime and blocks on it (callers get parallelism from their own threads: `block_on` may be
//! called from several threads at once). Transient errors (connection drops, 5xx, timeouts) are
//! retried by `object_store`'s own retry layer with exponential backoff (up to 10 retries
//! within 6 × the stall timeout, 3 minutes by default); what is left is reported with the
//! remote, the key and the backend's message (which carries the HTTP status).
//!
//! Stalls: a request that makes no progress for `super::TIMEOUT_ENV` seconds (default
//! `super::DEFAULT_TIMEOUT_SECS`) is abandoned and retried: connecting, waiting for the answer to a
//! request (its upload included) and between two reads of an answer's body. There is no cap on
//! a whole download, which `object_store`'s default (30 s per request, body included) would
//! put on every blob however fast it is arriving.
//!
//! Multipart uploads go through `object_store`'s lower-level `MultipartStore`, whose upload and
//! part ids can be kept: with a state directory ([`Remote::resume_uploads_in`]) a killed upload
//! is resumed by the next one from the parts that arrived (`upload_state.rs`).
//!
//! Secrets: the backend's errors quote the URLs of its requests, so each one is kept as
//! [`super::Masked`] text; an endpoint with user information or a query string in the
//! environment is refused as `remote add --endpoint` refuses one.

use super::upload_state::{self, PartDone, Prior, UploadState};
use super::{Error, Expect, Listed, Remote, Result, S3Options, Small, UploadMode, Uploaded, MAX_KEY_LEN, MAX_REF_LEN};
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GcpCredential, GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as StorePath;
use object_store::{
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    StaticCredentialProvider, UpdateVersion,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Part size of multipart uploads (S3 allows 5 MiB to 5 GiB, at most 10,000 parts).
pub(crate) const PART_SIZE: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// The environment variable that sets the part size of multipart uploads, in bytes.
pub(crate) const PART_SIZE_ENV: &str = "CKPT_PART_SIZE";
/// The smallest part size [`PART_SIZE_ENV`] may set: S3's minimum for every part but the last.
const MIN_PART_SIZE: usize = 5 << 20;

/// The part size: [`PART_SIZE_ENV`], or [`PART_SIZE`]; a value that is not a number of bytes
/// from [`MIN_PART_SIZE`] to 5 GiB is an error naming the remote at `url`.
fn part_size(url: &str) -> Result<usize> {
    let Some(value) = std::env::var_os(PART_SIZE_ENV) else { return Ok(PART_SIZE) };
    match value.to_str().and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| (MIN_PART_SIZE..=5 << 30).contains(n))
    {
        Some(n) => Ok(n),
        None => Err(Error::BadUrl {
            url: super::redact_url(url),
            reason: format!("{PART_SIZE_ENV}={value:?}: expected a number of bytes from {MIN_PART_SIZE} to 5 GiB"),
        }),
    }
}

/// A remote on an `object_store` backend.
pub struct StoreRemote {
    url: String,
    store: Arc<dyn ObjectStore>,
    /// The same store's multipart API, whose upload and part ids can be kept between runs.
    multipart: Arc<dyn MultipartStore>,
    prefix: String,
    runtime: tokio::runtime::Runtime,
    requests: AtomicU64,
    /// The backend keeps the uploaded buffers themselves (the in-memory store): uploads are
    /// copied, not handed over as a map of a file that may change after the upload.
    keeps_buffers: bool,
    /// Part size of multipart uploads ([`PART_SIZE`] unless set).
    part_size: usize,
    /// Where multipart uploads keep their state so that a rerun resumes them
    /// ([`Remote::resume_uploads_in`]); `None`: they are not kept.
    transfers: Option<PathBuf>,
}

impl std::fmt::Debug for StoreRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreRemote").field("url", &self.url).finish()
    }
}

fn runtime(url: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::BadUrl { url: super::redact_url(url), reason: format!("starting the I/O runtime: {e}") })
}

/// The environment variable that points Google's tools at a Cloud Storage emulator.
pub const GCS_EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";
/// The environment variable that gives Azurite's blob service URL (with
/// `AZURE_STORAGE_USE_EMULATOR=true`).
pub const AZURITE_URL_ENV: &str = "AZURITE_BLOB_STORAGE_URL";

/// The bucket (or container) and the prefix inside it of `url`, which starts with `scheme`
/// (`usage` shows the form). A URL with what looks like a secret in it is refused.
fn bucket_and_prefix<'a>(url: &'a str, scheme: &str, usage: &str) -> Result<(&'a str, &'a str)> {
    let rest = url.strip_prefix(scheme).unwrap_or(url);
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::BadUrl { url: super::redact_url(url), reason: format!("no bucket ({usage})") });
    }
    if let Some(reason) = super::secret_in(url) {
        // Stored by an older ckpt: the bucket and key names would carry it to the server
        // and into every error.
        return Err(Error::BadUrl {
            url: super::redact_url(url),
            reason: format!(
                "{reason}; remove this remote and add it again without it, and {}",
                super::CREDENTIALS_HOME
            ),
        });
    }
    Ok((bucket, prefix))
}

/// Regions are S3's: a GCS bucket or an Azure account has its own, which the URL names.
fn no_region(url: &str, options: &S3Options) -> Result<()> {
    match &options.region {
        Some(_) => {
            Err(Error::BadUrl { url: super::redact_url(url), reason: "a region applies to s3:// remotes only".into() })
        }
        None => Ok(()),
    }
}

/// The client settings of every backend: a stall timeout on connecting and on each read, no
/// cap on a whole request (object_store's default, 30 s, would cut every large download), and
/// retries within 6 × the stall timeout. Given as config keys, not as `ClientOptions`, which
/// would drop the client settings `from_env` read (proxies, `*_ALLOW_HTTP`).
fn client_settings(url: &str) -> Result<(Vec<(ClientConfigKey, String)>, RetryConfig)> {
    let stall = super::stall_timeout(url)?;
    let millis = format!("{}ms", stall.as_millis());
    let client = vec![
        (ClientConfigKey::ConnectTimeout, millis.clone()),
        (ClientConfigKey::ReadTimeout, millis),
        // The whole-request cap, off in effect (a stall is caught by the read timeout).
        (ClientConfigKey::Timeout, "24h".to_string()),
    ];
    Ok((client, RetryConfig { retry_timeout: 6 * stall, ..RetryConfig::default() }))
}

/// A builder's error for the remote at `url`. Builders' errors quote settings (masked: an
/// endpoint), never a secret key.
fn built(url: &str, e: &object_store::Error) -> Error {
    Error::BadUrl { url: super::redact_url(url), reason: super::Masked::new(e).to_string() }
}

/// `STORAGE_EMULATOR_HOST` as a base URL: Google's clients take `host:port` as plain HTTP.
pub(super) fn emulator_url(host: &str) -> String {
    let host = host.trim().trim_end_matches('/');
    if host.contains("://") {
        host.to_string()
    } else {
        format!("http://{host}")
    }
}

/// A boolean setting as object_store reads one (`AZURE_STORAGE_USE_EMULATOR`).
pub(super) fn is_truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes" | "y")
}

impl StoreRemote {
    /// [`StoreRemote::s3`] with these credentials instead of the environment's (for programs
    /// that hold them elsewhere).
    pub fn s3_with_credentials(
        url: &str,
        options: &S3Options,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> Result<StoreRemote> {
        Self::build(url, options, Some((access_key_id, secret_access_key)))
    }

    /// Multipart uploads in parts of `part_size` bytes (S3's minimum is 5 MiB), from objects
    /// of 4 parts on (default: `PART_SIZE`, from 64 MiB).
    pub fn with_part_size(mut self, part_size: usize) -> StoreRemote {
        self.part_size = part_size.max(1);
        self
    }

    /// Objects at least this large (and allowed to: [`UploadMode::MayReplace`]) go up as
    /// multipart uploads (4 parts: smaller ones gain little from parallel parts).
    fn multipart_threshold(&self) -> u64 {
        4 * self.part_size as u64
    }

    /// Opens `s3://bucket[/prefix]`. Credentials, region and endpoint come from the `AWS_*`
    /// environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`), overridden by `options`. Requests
    /// are path-style (`endpoint/bucket/key`), which every S3-compatible server accepts.
    pub fn s3(url: &str, options: &S3Options) -> Result<StoreRemote> {
        Self::build(url, options, None)
    }

    fn build(url: &str, options: &S3Options, credentials: Option<(&str, &str)>) -> Result<StoreRemote> {
        let (bucket, prefix) = bucket_and_prefix(url, "s3://", "s3://BUCKET/PREFIX")?;
        let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        match &options.endpoint {
            // Both keys: `AWS_ENDPOINT_URL_S3` from the environment would win over `Endpoint`.
            Some(endpoint) => {
                builder = builder.with_endpoint(endpoint).with_config(AmazonS3ConfigKey::S3Endpoint, endpoint.as_str());
            }
            None => {
                for (key, variable) in [
                    (AmazonS3ConfigKey::S3Endpoint, "AWS_ENDPOINT_URL_S3"),
                    (AmazonS3ConfigKey::Endpoint, "AWS_ENDPOINT_URL"),
                ] {
                    if let Some(endpoint) = builder.get_config_value(&key) {
                        super::check_env_endpoint(variable, &endpoint)?;
                    }
                }
            }
        }
        if let Some(region) = &options.region {
            builder = builder.with_region(region);
        }
        if options.allow_http {
            builder = builder.with_allow_http(true);
        }
        if let Some((key, secret)) = credentials {
            builder = builder.with_access_key_id(key).with_secret_access_key(secret);
        }
        // Set through config keys, not `with_client_options`, which would drop the client
        // settings `from_env` read (`AWS_ALLOW_HTTP`, proxies).
        let (client, retry) = client_settings(url)?;
        for (key, value) in client {
            builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
        }
        // The builder's errors quote settings (masked: an endpoint), never the secret key.
        let store = builder.with_retry(retry).build().map_err(|e| built(url, &e))?;
        Self::over(url, Arc::new(store), prefix)
    }

    /// Opens `gs://bucket[/prefix]` (Google Cloud Storage). Credentials come from the
    /// environment as Google's tools find them (`GOOGLE_APPLICATION_CREDENTIALS`,
    /// `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_SERVICE_ACCOUNT_KEY`, gcloud's application default
    /// credentials, else the instance's metadata server). With [`GCS_EMULATOR_ENV`] set
    /// (`http://127.0.0.1:4443`, or `host:port`), requests go there without credentials, as
    /// Google's client libraries do; `options.endpoint` sets the base URL instead (with
    /// credentials, unless the emulator variable is set).
    pub fn gcs(url: &str, options: &S3Options) -> Result<StoreRemote> {
        let emulator = std::env::var(GCS_EMULATOR_ENV).ok().filter(|host| !host.trim().is_empty());
        if let Some(host) = &emulator {
            super::check_env_endpoint(GCS_EMULATOR_ENV, &emulator_url(host))?;
        }
        Self::gcs_at(url, options, emulator.as_deref())
    }

    /// [`StoreRemote::gcs`] on the Cloud Storage emulator at `host` (as `STORAGE_EMULATOR_HOST`
    /// gives it), whatever the environment says: for programs (and tests) that cannot set it.
    pub fn gcs_emulator(url: &str, host: &str) -> Result<StoreRemote> {
        Self::gcs_at(url, &S3Options::default(), Some(host))
    }

    fn gcs_at(url: &str, options: &S3Options, emulator: Option<&str>) -> Result<StoreRemote> {
        let (bucket, prefix) = bucket_and_prefix(url, "gs://", "gs://BUCKET/PREFIX")?;
        no_region(url, options)?;
        let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
        if let Some(base) = builder.get_config_value(&GoogleConfigKey::BaseUrl) {
            super::check_env_endpoint("GOOGLE_BASE_URL", &base)?;
        }
        match (&options.endpoint, emulator) {
            (Some(endpoint), _) => builder = builder.with_base_url(endpoint.trim_end_matches('/')),
            (None, Some(host)) => builder = builder.with_base_url(&emulator_url(host)),
            (None, None) => {}
        }
        if emulator.is_some() {
            // No token at all (an empty one sends no Authorization header): an emulator has
            // no accounts, and no credential lookup (files, the metadata server) is tried.
            let anonymous = StaticCredentialProvider::new(GcpCredential { bearer: String::new() });
            builder = builder.with_credentials(Arc::new(anonymous));
        }
        let (client, retry) = client_settings(url)?;
        for (key, value) in client {
            builder = builder.with_config(GoogleConfigKey::Client(key), value);
        }
        let store = builder.with_retry(retry).build().map_err(|e| built(url, &e))?;
        Self::over(url, Arc::new(store), prefix)
    }

    /// Opens `az://container[/prefix]` (or `azure://`: Azure Blob Storage). The account and
    /// its credentials come from the `AZURE_*` environment (`AZURE_STORAGE_ACCOUNT_NAME` with
    /// `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_TOKEN`, a service principal's
    /// `AZURE_CLIENT_ID`/`AZURE_CLIENT_SECRET`/`AZURE_TENANT_ID`, workload or managed identity,
    /// or `AZURE_USE_AZURE_CLI`). `AZURE_STORAGE_USE_EMULATOR=true` reaches Azurite at
    /// `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`) with its well-known
    /// development account; `options.endpoint` is the account's blob service URL instead
    /// (`https://ACCOUNT.blob.core.windows.net`, or `http://127.0.0.1:10000/ACCOUNT`).
    pub fn azure(url: &str, options: &S3Options) -> Result<StoreRemote> {
        Self::azure_build(url, options, None)
    }

    /// [`StoreRemote::azure`] with this storage account and access key instead of the
    /// environment's (for programs that hold them elsewhere); `options.endpoint` is the
    /// account's blob service URL (default `https://ACCOUNT.blob.core.windows.net`).
    pub fn azure_with_key(url: &str, options: &S3Options, account: &str, access_key: &str) -> Result<StoreRemote> {
        Self::azure_build(url, options, Some((account, access_key)))
    }

    fn azure_build(url: &str, options: &S3Options, credentials: Option<(&str, &str)>) -> Result<StoreRemote> {
        let scheme = if url.starts_with("azure://") { "azure://" } else { "az://" };
        let (container, prefix) = bucket_and_prefix(url, scheme, "az://CONTAINER/PREFIX")?;
        no_region(url, options)?;
        let mut builder = MicrosoftAzureBuilder::from_env().with_container_name(container);
        if let Some((account, key)) = credentials {
            builder = builder.with_use_emulator(false).with_account(account).with_access_key(key);
        }
        let emulator = builder.get_config_value(&AzureConfigKey::UseEmulator).is_some_and(|v| is_truthy(&v));
        if emulator {
            if let Ok(azurite) = std::env::var(AZURITE_URL_ENV) {
                super::check_env_endpoint(AZURITE_URL_ENV, &azurite)?;
            }
            if options.endpoint.is_some() {
                return Err(Error::BadUrl {
                    url: super::redact_url(url),
                    reason: format!(
                        "an endpoint is set and AZURE_STORAGE_USE_EMULATOR asks for Azurite: give Azurite's URL \
                         in {AZURITE_URL_ENV}, or unset AZURE_STORAGE_USE_EMULATOR"
                    ),
                });
            }
        } else {
            if let Some(endpoint) = builder.get_config_value(&AzureConfigKey::Endpoint) {
                super::check_env_endpoint("AZURE_STORAGE_ENDPOINT", &endpoint)?;
            }
            if builder.get_config_value(&AzureConfigKey::AccountName).is_none() {
                return Err(Error::BadUrl {
                    url: super::redact_url(url),
                    reason: "no storage account: set AZURE_STORAGE_ACCOUNT_NAME (or AZURE_STORAGE_USE_EMULATOR=true \
                             for Azurite)"
                        .into(),
                });
            }
        }
        if let Some(endpoint) = &options.endpoint {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        if options.allow_http {
            builder = builder.with_allow_http(true);
        }
        let (client, retry) = client_settings(url)?;
        for (key, value) in client {
            builder = builder.with_config(AzureConfigKey::Client(key), value);
        }
        let store = builder.with_retry(retry).build().map_err(|e| built(url, &e))?;
        Self::over(url, Arc::new(store), prefix)
    }

    /// A remote on `store` (opened from `url`), its keys under `prefix`.
    fn over<S: ObjectStore + MultipartStore>(url: &str, store: Arc<S>, prefix: &str) -> Result<StoreRemote> {
        Ok(StoreRemote {
            url: super::redact_url(url),
            store: store.clone(),
            multipart: store,
            prefix: prefix.trim_matches('/').to_string(),
            runtime: runtime(url)?,
            requests: AtomicU64::new(0),
            keeps_buffers: false,
            part_size: part_size(url)?,
            transfers: None,
        })
    }

    /// A fresh, empty in-memory remote (tests).
    pub fn memory() -> StoreRemote {
        let store = Arc::new(object_store::memory::InMemory::new());
        StoreRemote {
            url: "memory://".into(),
            store: store.clone(),
            multipart: store,
            prefix: String::new(),
            runtime: runtime("memory://").expect("a runtime starts"),
            requests: AtomicU64::new(0),
            keeps_buffers: true,
            part_size: PART_SIZE,
            transfers: None,
        }
    }

    fn location(&self, key: &str) -> StorePath {
        if self.prefix.is_empty() {
            StorePath::from(key)
        } else {
            StorePath::from(format!("{}/{key}", self.prefix))
        }
    }

    fn backend(&self, action: &'static str, key: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound { remote: self.url.clone(), key: key.into() },
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                Error::Conflict { remote: self.url.clone(), key: key.into() }
            }
            e => Error::Backend { remote: self.url.clone(), action, key: key.into(), source: super::Masked::new(&e) },
        }
    }

    fn count(&self, n: u64) {
        self.requests.fetch_add(n, Ordering::Relaxed);
    }

    fn io(&self, action: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io { remote: self.url.clone(), action, path: path.to_path_buf(), source }
    }

    /// The file `path` as shared bytes without copying it into memory: a read-only map, which
    /// the kernel pages in as the upload reads it.
    fn map(&self, file: &std::fs::File, path: &Path, len: u64) -> Result<bytes::Bytes> {
        let map = crate::mmap::map(file).map_err(|e| self.io("reading", path, e))?;
        if map.len() as u64 != len {
            let e = std::io::Error::other(format!("{} bytes, expected {len}", map.len()));
            return Err(self.io("reading", path, e));
        }
        if self.keeps_buffers {
            return Ok(bytes::Bytes::copy_from_slice(&map));
        }
        Ok(bytes::Bytes::from_owner(MapBytes(map)))
    }
}

impl StoreRemote {
    /// Writes the body of `got` (the object `key` from byte `offset` on) into `out`, the whole
    /// object at most `limit` bytes; returns the bytes written.
    async fn stream_into(
        &self,
        key: &str,
        got: object_store::GetResult,
        offset: u64,
        out: &mut dyn Write,
        limit: u64,
    ) -> Result<u64> {
        if got.meta.size > limit {
            return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit });
        }
        let mut stream = got.into_stream();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.backend("downloading", key, e))?;
            n += chunk.len() as u64;
            if offset.saturating_add(n) > limit {
                return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit });
            }
            out.write_all(&chunk).map_err(|e| Error::Io {
                remote: self.url.clone(),
                action: "writing what was downloaded of",
                path: key.into(),
                source: e,
            })?;
        }
        Ok(n)
    }
}

/// A file map as the owner of [`bytes::Bytes`].
struct MapBytes(crate::mmap::Map);

impl AsRef<[u8]> for MapBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Remote for StoreRemote {
    fn url(&self) -> &str {
        &self.url
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.list_modified(prefix)?.into_iter().map(|l| l.key).collect())
    }

    fn list_modified(&self, prefix: &str) -> Result<Vec<Listed>> {
        let location = self.location(prefix.trim_end_matches('/'));
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        self.runtime.block_on(async {
            let mut stream = self.store.list(Some(&location));
            let mut out = Vec::new();
            let mut seen = 0usize;
            // One request per page of (up to) 1000 keys.
            self.count(1);
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| self.backend("listing", prefix, e))?;
                if out.len() % 1000 == 999 {
                    self.count(1);
                }
                super::count_listed(&mut seen, &self.url, prefix)?;
                let key = meta.location.as_ref();
                if let Some(rel) = key.strip_prefix(strip.as_str()).filter(|k| k.len() <= MAX_KEY_LEN) {
                    out.push(Listed { key: rel.to_string(), modified: meta.last_modified.into(), size: meta.size });
                }
            }
            Ok(out)
        })
    }

    fn exists(&self, key: &str) -> Result<bool> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            match self.store.head(&location).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(self.backend("checking", key, e)),
            }
        })
    }

    fn modified(&self, key: &str) -> Result<Option<std::time::SystemTime>> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            match self.store.head(&location).await {
                Ok(meta) => Ok(Some(meta.last_modified.into())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.backend("checking", key, e)),
            }
        })
    }

    fn get_small(&self, key: &str) -> Result<Option<Small>> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            let got = match self.store.get(&location).await {
                Ok(g) => g,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(self.backend("reading", key, e)),
            };
            if got.meta.size > MAX_REF_LEN {
                return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit: MAX_REF_LEN });
            }
            let tag =
                serde_json::to_string(&(got.meta.e_tag.clone(), got.meta.version.clone())).expect("strings serialize");
            // The body, not the size the answer claimed, is what must stay small.
            let mut body = got.into_stream();
            let mut bytes = Vec::new();
            while let Some(part) = body.next().await {
                bytes.extend_from_slice(&part.map_err(|e| self.backend("reading", key, e))?);
                if bytes.len() as u64 > MAX_REF_LEN {
                    return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit: MAX_REF_LEN });
                }
            }
            Ok(Some(Small { bytes, tag }))
        })
    }

    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> Result<()> {
        self.count(1);
        let mode = match expect {
            Expect::Absent => PutMode::Create,
            Expect::Tag(tag) => {
                let (e_tag, version): (Option<String>, Option<String>) = serde_json::from_str(tag)
                    .map_err(|_| Error::Conflict { remote: self.url.clone(), key: key.into() })?;
                PutMode::Update(UpdateVersion { e_tag, version })
            }
        };
        let location = self.location(key);
        let payload = PutPayload::from(bytes.to_vec());
        self.runtime.block_on(async {
            let options = PutOptions { mode, ..PutOptions::default() };
            self.store.put_opts(&location, payload, options).await.map_err(|e| self.backend("writing", key, e))?;
            Ok(())
        })
    }

    fn upload(&self, key: &str, file: &std::fs::File, path: &Path, len: u64, mode: UploadMode) -> Result<Uploaded> {
        let location = self.location(key);
        let data = self.map(file, path, len)?;
        if mode == UploadMode::MayReplace && len >= self.multipart_threshold() {
            return self.upload_parts(key, &location, data);
        }
        self.count(1);
        self.runtime.block_on(async {
            let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
            match self.store.put_opts(&location, PutPayload::from_bytes(data), options).await {
                Ok(_) => Ok(Uploaded::Created),
                Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                    Ok(Uploaded::Existed)
                }
                Err(e) => Err(self.backend("uploading", key, e)),
            }
        })
    }

    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> Result<()> {
        // A large object (a writer's standalone rewrite of an old one) goes up in parts, as an
        // upload that may replace does (a single PUT stops at 5 GiB); S3 makes the whole object
        // visible at once either way.
        if len >= self.multipart_threshold() {
            return self.upload(key, file, path, len, UploadMode::MayReplace).map(|_| ());
        }
        // One unconditional PUT.
        self.count(1);
        let location = self.location(key);
        let data = self.map(file, path, len)?;
        self.runtime.block_on(async {
            let options = PutOptions { mode: PutMode::Overwrite, ..PutOptions::default() };
            self.store
                .put_opts(&location, PutPayload::from_bytes(data), options)
                .await
                .map_err(|e| self.backend("replacing", key, e))?;
            Ok(())
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            match self.store.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.backend("deleting", key, e)),
            }
        })
    }

    fn read_head(&self, key: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(0..len)),
                ..object_store::GetOptions::default()
            };
            let got = self.store.get_opts(&location, options).await.map_err(|e| self.backend("reading", key, e))?;
            let size = got.meta.size;
            let mut stream = got.into_stream();
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                bytes.extend_from_slice(&chunk.map_err(|e| self.backend("reading", key, e))?);
                if bytes.len() as u64 >= len {
                    bytes.truncate(usize::try_from(len).unwrap_or(usize::MAX));
                    break;
                }
            }
            Ok((bytes, size))
        })
    }

    fn read_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        self.count(1);
        if range.start >= range.end {
            return super::checked_range(&self.url, key, &range, Vec::new(), false);
        }
        let location = self.location(key);
        let want = range.end - range.start;
        self.runtime.block_on(async {
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(range.clone())),
                ..Default::default()
            };
            let got = self.store.get_opts(&location, options).await.map_err(|e| self.backend("reading", key, e))?;
            let mut stream = got.into_stream();
            // Never more than the range (and the chunk that overflows it) is held.
            let mut bytes = Vec::with_capacity(usize::try_from(want.min(1 << 24)).unwrap_or(0));
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.backend("reading", key, e))?;
                if bytes.len() as u64 + chunk.len() as u64 > want {
                    return super::checked_range(&self.url, key, &range, bytes, true);
                }
                bytes.extend_from_slice(&chunk);
            }
            super::checked_range(&self.url, key, &range, bytes, false)
        })
    }

    fn download(&self, key: &str, out: &mut dyn Write, limit: u64) -> Result<u64> {
        self.count(1);
        let location = self.location(key);
        self.runtime.block_on(async {
            let got = self.store.get(&location).await.map_err(|e| self.backend("downloading", key, e))?;
            self.stream_into(key, got, 0, out, limit).await
        })
    }

    fn download_from(&self, key: &str, offset: u64, out: &mut dyn Write, limit: u64) -> Result<u64> {
        if offset == 0 {
            return self.download(key, out, limit);
        }
        // The size first: a range past the end is an error S3 words in many ways.
        self.count(2);
        let location = self.location(key);
        self.runtime.block_on(async {
            let meta = self.store.head(&location).await.map_err(|e| self.backend("downloading", key, e))?;
            if meta.size < offset {
                return Err(Error::Shorter { remote: self.url.clone(), key: key.into(), offset, size: meta.size });
            }
            if meta.size > limit {
                return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit });
            }
            if meta.size == offset {
                return Ok(0);
            }
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Offset(offset)),
                // The same object as the one sized (a mirror push may recode it meanwhile).
                if_match: meta.e_tag.clone(),
                ..object_store::GetOptions::default()
            };
            let got = self.store.get_opts(&location, options).await.map_err(|e| self.backend("downloading", key, e))?;
            self.stream_into(key, got, offset, out, limit).await
        })
    }

    fn resume_uploads_in(&mut self, dir: &Path) {
        self.transfers = Some(dir.to_path_buf());
        // Uploads nobody resumed for a week: aborted, so that their parts are not billed
        // forever (best effort; a remote that cannot be reached now is asked next time).
        for (path, state, lock) in upload_state::abandoned(dir, &self.url) {
            let location = self.location(&state.key);
            self.count(1);
            let gone = match self.runtime.block_on(self.multipart.abort_multipart(&location, &state.upload_id)) {
                Ok(()) => true,
                Err(e) => dead_upload(&e),
            };
            if gone {
                upload_state::remove(&path, lock);
            }
        }
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// Resumable multipart uploads (docs/format.md, "Transfer state"): the upload id and each
/// part that arrived are kept in a state file (`upload_state.rs`) when the remote was given a
/// directory for them ([`Remote::resume_uploads_in`]); a rerun sends only the parts missing.
impl StoreRemote {
    /// Uploads `data` under `key` (at `location`) in parts of `self.part_size`, resuming the
    /// upload a killed run left if its state says it sends these bytes. An upload that cannot
    /// be resumed (its state names other bytes or is damaged; the remote aborted or expired
    /// it) is aborted and started over, once.
    fn upload_parts(&self, key: &str, location: &StorePath, data: bytes::Bytes) -> Result<Uploaded> {
        let len = data.len() as u64;
        let part_size = self.part_size as u64;
        let kept = self.transfers.as_deref().and_then(|dir| Kept::lock(dir, &self.url, key));
        let prior =
            kept.as_ref().map_or(Prior::None, |k| upload_state::read_prior(&k.path, &self.url, key, len, part_size));
        let (mut resume, mut stale) = match prior {
            Prior::Resume(state) => match state.parts.iter().all(|p| {
                let range = state.part_range(p.index);
                upload_state::hash_hex(&data[range.start as usize..range.end as usize]) == p.blake3
            }) {
                true => (Some(state), None),
                // The object's bytes there changed since: none of that upload is kept.
                false => (None, Some(state.upload_id)),
            },
            Prior::Abort { upload_id } => (None, Some(upload_id)),
            Prior::None | Prior::Unreadable => (None, None),
        };
        let fail = |e| self.backend("uploading", key, e);
        let uploaded = self.runtime.block_on(async {
            loop {
                let resumed = resume.is_some();
                let state = match resume.take() {
                    Some(state) => state,
                    None => {
                        self.count(1);
                        let upload_id = self.multipart.create_multipart(location).await.map_err(fail)?;
                        let state = UploadState {
                            format: upload_state::FORMAT,
                            remote: self.url.clone(),
                            key: key.to_string(),
                            len,
                            part_size,
                            upload_id,
                            parts: Vec::new(),
                        };
                        // Kept before any part goes: a run killed now still knows what to abort.
                        if let Some(k) = &kept {
                            k.write(&state);
                        }
                        if let Some(old) = stale.take() {
                            // Best effort: the remote may have dropped it already.
                            self.count(1);
                            let _ = self.multipart.abort_multipart(location, &old).await;
                        }
                        state
                    }
                };
                let upload_id = state.upload_id.clone();
                match self.send_parts(location, &data, state, kept.as_ref()).await {
                    Ok(()) => return Ok(()),
                    // A resumed upload the remote no longer has (aborted, expired) or whose
                    // parts it refuses: started over once, the old one aborted.
                    Err(e) if resumed && dead_upload(&e) => stale = Some(upload_id),
                    Err(e) => return Err(fail(e)),
                }
            }
        });
        if let Some(k) = kept {
            match uploaded {
                Ok(()) => k.remove(),
                // Kept for the rerun (a network error); it resumes from the parts that arrived.
                Err(_) => drop(k),
            }
        }
        uploaded.map(|()| Uploaded::Replaced)
    }

    /// Sends the parts of `data` that `state` lacks, [`PARTS_IN_FLIGHT`] at a time, each noted
    /// in `kept` as it arrives, then completes the upload.
    async fn send_parts(
        &self,
        location: &StorePath,
        data: &bytes::Bytes,
        state: UploadState,
        kept: Option<&Kept>,
    ) -> object_store::Result<()> {
        let count = UploadState::part_count(state.len, state.part_size);
        let have: std::collections::HashSet<u64> = state.parts.iter().map(|p| p.index).collect();
        let missing: Vec<u64> = (0..count).filter(|i| !have.contains(i)).collect();
        let upload_id = state.upload_id.clone();
        let ranges: Vec<_> = missing.iter().map(|&i| (i, state.part_range(i))).collect();
        let state = std::sync::Mutex::new(state);
        self.count(ranges.len() as u64 + 1);
        futures_util::stream::iter(ranges)
            .map(|(index, range)| {
                let (state, upload_id) = (&state, &upload_id);
                let bytes = data.slice(range.start as usize..range.end as usize);
                async move {
                    let blake3 = upload_state::hash_hex(&bytes);
                    let size = bytes.len() as u64;
                    let part = self
                        .multipart
                        .put_part(location, upload_id, index as usize, PutPayload::from_bytes(bytes))
                        .await?;
                    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                    state.parts.push(PartDone { index, size, etag: part.content_id, blake3 });
                    if let Some(k) = kept {
                        k.write(&state);
                    }
                    Ok::<(), object_store::Error>(())
                }
            })
            .buffer_unordered(PARTS_IN_FLIGHT)
            .try_collect::<()>()
            .await?;
        let mut parts = state.into_inner().unwrap_or_else(|e| e.into_inner()).parts;
        parts.sort_by_key(|p| p.index);
        let ids = parts.into_iter().map(|p| PartId { content_id: p.etag }).collect();
        self.multipart.complete_multipart(location, &upload_id, ids).await?;
        Ok(())
    }
}

/// Whether an error of a resumed upload says the upload itself is gone or refuses its parts
/// (S3: 404 `NoSuchUpload`, 400 `InvalidPart`; s3s-fs answers 403 for an upload it does not
/// know), rather than that the remote could not be reached: only then is it started over. A
/// 403 for want of permission is safe to take for one too: starting over needs a new upload,
/// which fails the same way, and the state is kept until a new upload exists.
fn dead_upload(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. } => true,
        // The in-memory store's errors for an unknown upload or a missing part.
        object_store::Error::Generic { store: "InMemory", .. } => true,
        e => {
            let text = super::Masked::new(e).to_string();
            ["status code: 400", "InvalidPart", "NoSuchUpload"].iter().any(|s| text.contains(s))
        }
    }
}

/// The state file of one upload with its lock held (`upload_state.rs`).
struct Kept {
    path: PathBuf,
    lock: std::fs::File,
}

impl Kept {
    /// Locks the state of the upload of `key` to `url` in `dir` (created if missing); `None`
    /// (the upload is then not kept) if another process drives that upload now or the
    /// directory cannot be used.
    fn lock(dir: &Path, url: &str, key: &str) -> Option<Kept> {
        std::fs::create_dir_all(dir).ok()?;
        let path = upload_state::state_path(dir, url, key);
        let lock = upload_state::try_lock_path(&upload_state::lock_path(&path)).ok()??;
        Some(Kept { path, lock })
    }

    /// Replaces the state file by `state`. Best effort: a state that could not be written
    /// leaves the previous one, which names fewer parts (sent again by a rerun).
    fn write(&self, state: &UploadState) {
        let _ = upload_state::write_state(&self.path, state);
    }

    /// Removes the state file (the upload completed).
    fn remove(self) {
        upload_state::remove(&self.path, self.lock);
    }
}
