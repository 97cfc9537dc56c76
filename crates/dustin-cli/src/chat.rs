//! `dustin generate --chat`: prompts written as conversations and rendered with the model's
//! chat template (`dustin_qwen::chat`, as transformers' `apply_chat_template(...,
//! add_generation_prompt=True)`), generation stopping at the template's end-of-turn tokens.

use std::path::{Path, PathBuf};

use clap::Args;
use dustin_qwen::chat::Message;
use dustin_qwen::{ModelFiles, QwenError, Tokenizer};

use crate::CliError;

/// The chat options of `dustin generate`.
#[derive(Debug, Clone, Default, Args)]
pub struct ChatArgs {
    /// Render the prompts as chats with the model's chat template (as transformers'
    /// `apply_chat_template` with `add_generation_prompt`) and stop at the template's
    /// end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`, ...) as well as EOS. Each --user,
    /// --prompt and --prompt-file text is the user message of one conversation (after
    /// --system when given); each --chat-file is one conversation.
    #[arg(long)]
    pub chat: bool,
    /// System message of the --user / --prompt / --prompt-file conversations (needs --chat;
    /// without it, the template's default applies, e.g. Qwen2.5's "You are Qwen, ...").
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// User message of one conversation (needs --chat); repeatable for a batch.
    #[arg(long, requires = "chat")]
    pub user: Vec<String>,
    /// JSON file holding one conversation: a list of `{"role": ..., "content": ...}`
    /// messages (OpenAI style; `{"messages": [...]}` also works). Needs --chat; repeatable.
    #[arg(long = "chat-file", requires = "chat")]
    pub chat_files: Vec<PathBuf>,
}

/// What `dustin generate` is asked to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inputs {
    /// Plain prompts, tokenized as they are.
    Plain(Vec<String>),
    /// Conversations to render with the model's chat template.
    Chat(Vec<Vec<Message>>),
}

impl Inputs {
    /// The conversations of the chat options, given the plain prompts (`--prompt`,
    /// `--prompt-file`); without `--chat`, the plain prompts themselves.
    ///
    /// # Errors
    /// [`CliError::Usage`] for an empty message, a chat file that is not a conversation
    /// (named with the problem), or no message at all; [`CliError::Io`] for an unreadable
    /// chat file.
    pub fn from_args(
        chat: &ChatArgs,
        read_plain: impl FnOnce() -> Result<Vec<String>, CliError>,
        has_plain: bool,
    ) -> Result<Self, CliError> {
        if !chat.chat {
            return read_plain().map(Self::Plain);
        }
        let mut users = chat.user.clone();
        if has_plain {
            users.extend(read_plain()?);
        }
        let system = chat.system.as_deref().map(Message::system);
        if system.as_ref().is_some_and(|s| s.content.trim().is_empty()) {
            return Err(CliError::Usage("--system is empty".into()));
        }
        let mut out = Vec::new();
        for u in users {
            if u.trim().is_empty() {
                return Err(CliError::Usage(format!(
                    "--chat: user message {} is empty",
                    out.len()
                )));
            }
            out.push(system.iter().cloned().chain([Message::user(u)]).collect());
        }
        for p in &chat.chat_files {
            let mut conv = read_chat_file(p)?;
            if let Some(s) = &system {
                if conv.first().is_some_and(|m| m.role == "system") {
                    return Err(CliError::Usage(format!(
                        "--system and --chat-file {}: the file has its own system message",
                        p.display()
                    )));
                }
                conv.insert(0, s.clone());
            }
            out.push(conv);
        }
        if out.is_empty() {
            return Err(CliError::Usage(
                "--chat: no message: give --user TEXT, --prompt TEXT, --prompt-file FILE or \
                 --chat-file FILE"
                    .into(),
            ));
        }
        Ok(Self::Chat(out))
    }

    /// The prompt texts, and the tokenizer to generate with: for chats, each conversation
    /// rendered with the model's chat template (`add_generation_prompt`), and the tokenizer's
    /// EOS ids extended with the template's end-of-turn tokens
    /// ([`dustin_qwen::ChatTemplate::stop_token_ids`]), which both autoregressive and
    /// speculative decoding stop at. A note on standard error tells the template's origin
    /// and the stop tokens.
    ///
    /// # Errors
    /// [`CliError::Usage`] when the model has no chat template; the template's errors
    /// ([`QwenError::ChatTemplate`]).
    pub fn render(
        &self,
        files: &ModelFiles,
        model: &Path,
    ) -> Result<(Vec<String>, Tokenizer), CliError> {
        let mut tok = files.tokenizer.clone();
        let convs = match self {
            Self::Plain(p) => return Ok((p.clone(), tok)),
            Self::Chat(c) => c,
        };
        let Some(t) = &files.chat_template else {
            let e = QwenError::NoChatTemplate {
                model: model.display().to_string(),
            };
            return Err(CliError::Usage(format!(
                "--chat: {e}; leave out --chat and write the prompt in the model's format"
            )));
        };
        let prompts = convs
            .iter()
            .map(|c| t.render(c, true))
            .collect::<Result<Vec<_>, _>>()?;
        tok.eos_ids = t.stop_token_ids(&tok);
        let names: Vec<String> = tok
            .eos_ids
            .iter()
            .map(|&id| match tok.decode(&[id]) {
                Ok(s) => format!("{s:?} ({id})"),
                Err(_) => id.to_string(),
            })
            .collect();
        eprintln!(
            "chat: template of {}; stop tokens {}",
            t.origin(),
            names.join(", ")
        );
        Ok((prompts, tok))
    }
}

/// The roles a conversation file may use.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// A conversation file: a JSON list of messages, or an object with `messages`; each role
/// one of [`ROLES`], each system or user message with text.
fn read_chat_file(path: &Path) -> Result<Vec<Message>, CliError> {
    let bad = |why: String| CliError::Usage(format!("--chat-file {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::InvalidData {
            bad("not UTF-8 text (expected a JSON file)".into())
        } else {
            CliError::Io {
                path: path.display().to_string(),
                source,
            }
        }
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let list = match v {
        serde_json::Value::Array(a) => a,
        serde_json::Value::Object(mut o) => match o.remove("messages") {
            Some(serde_json::Value::Array(a)) => a,
            _ => {
                return Err(bad(
                    "expected a list of messages or {\"messages\": [...]}".into()
                ))
            }
        },
        _ => {
            return Err(bad(
                "expected a list of messages or {\"messages\": [...]}".into()
            ))
        }
    };
    if list.is_empty() {
        return Err(bad("the conversation has no message".into()));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let m = serde_json::from_value::<Message>(m).map_err(|e| {
                bad(format!(
                    "message {i}: {e} (a message is {{\"role\": \"...\", \"content\": \"...\"}} \
                     with text content)"
                ))
            })?;
            if !ROLES.contains(&m.role.as_str()) {
                return Err(bad(format!(
                    "message {i}: role {:?}, expected one of {}",
                    m.role,
                    ROLES.join(", ")
                )));
            }
            if (m.role == "system" || m.role == "user") && m.content.trim().is_empty() {
                return Err(bad(format!("message {i}: the {} message is empty", m.role)));
            }
            Ok(m)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("dustin-chat-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn chat(user: &[&str], system: Option<&str>, files: &[PathBuf]) -> ChatArgs {
        ChatArgs {
            chat: true,
            system: system.map(String::from),
            user: user.iter().map(|s| s.to_string()).collect(),
            chat_files: files.to_vec(),
        }
    }

    #[test]
    fn plain_prompts_pass_through_without_chat() {
        let got = Inputs::from_args(&ChatArgs::default(), || Ok(vec!["a".into()]), true);
        assert_eq!(got.unwrap(), Inputs::Plain(vec!["a".into()]));
    }

    #[test]
    fn users_prompts_and_files_make_one_conversation_each() {
        let f = scratch(
            "ok.json",
            r#"[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"}]"#,
        );
        let g = scratch(
            "obj.json",
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
        );
        let args = chat(&["u1"], Some("sys"), &[f.clone(), g.clone()]);
        let got = Inputs::from_args(&args, || Ok(vec!["p1".into()]), true).unwrap();
        let s = Message::system("sys");
        assert_eq!(
            got,
            Inputs::Chat(vec![
                vec![s.clone(), Message::user("u1")],
                vec![s.clone(), Message::user("p1")],
                vec![
                    s.clone(),
                    Message::user("q"),
                    Message::assistant("a"),
                    Message::user("q2")
                ],
                vec![s, Message::user("x")],
            ])
        );
        // no plain prompts: the reader is not asked
        let got = Inputs::from_args(&chat(&["u"], None, &[]), || panic!("read"), false);
        assert_eq!(got.unwrap(), Inputs::Chat(vec![vec![Message::user("u")]]));
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_file(g);
    }

    #[test]
    fn bad_chats_are_named() {
        let err = |args: ChatArgs| {
            Inputs::from_args(&args, || Ok(vec![]), false)
                .unwrap_err()
                .to_string()
        };
        assert!(err(chat(&[], None, &[])).contains("--chat: no message"));
        assert!(err(chat(&[" "], None, &[])).contains("user message 0 is empty"));
        assert!(err(chat(&["u"], Some(""), &[])).contains("--system is empty"));
        for (name, text, want) in [
            ("bad1.json", "{", "not JSON"),
            ("bad2.json", "[]", "no message"),
            ("bad3.json", "3", "expected a list of messages"),
            (
                "bad4.json",
                r#"[{"role": "user", "content": "x", "name": "n"}]"#,
                "message 0: unknown field `name`",
            ),
            (
                "bad5.json",
                r#"[{"role": "user", "content": [{"type": "text"}]}]"#,
                "message 0: invalid type",
            ),
        ] {
            let p = scratch(name, text);
            let e = err(chat(&[], None, std::slice::from_ref(&p)));
            assert!(e.contains(&format!("--chat-file {}", p.display())), "{e}");
            assert!(e.contains(want), "{name}: {e}");
            let _ = std::fs::remove_file(p);
        }
        let p = scratch("sys.json", r#"[{"role": "system", "content": "s"}]"#);
        let e = err(chat(&[], Some("x"), std::slice::from_ref(&p)));
        assert!(e.contains("has its own system message"), "{e}");
        let _ = std::fs::remove_file(p);
    }
}
