//! What a remote entry of a JSON configuration says that decides whether `wrap` can put the
//! proxy in front of it: its transport, and how it signs in through its client.

use serde_json::Value;

use super::client::Client;
use super::plan::SignIn;

/// How a remote entry signs in through its client (`oauth`: Claude Code, Gemini CLI, opencode;
/// `authProviderType`: Gemini CLI), when the proxy can take it over: discovery, with the
/// entry's pre-registered client if it names one.
pub(super) fn sign_in(obj: &serde_json::Map<String, Value>) -> Result<Option<SignIn>, String> {
    let mut sign_in = SignIn::default();
    match obj.get("authProviderType") {
        None => {}
        Some(Value::String(kind)) if kind == "dynamic_discovery" => {
            sign_in.keys.push("authProviderType".into());
        }
        Some(kind) => {
            return Err(format!(
                "it signs in with its client's {kind} provider, which mcp-budget cannot do for it (it signs in by the MCP authorization spec's discovery)"
            ));
        }
    }
    match obj.get("oauth") {
        None => {}
        Some(Value::Object(oauth)) => {
            if oauth.contains_key("authorizationUrl") || oauth.contains_key("tokenUrl") {
                return Err(
                    "its oauth names its own authorization and token URLs; mcp-budget finds them by the MCP authorization spec's discovery and does not take them".into(),
                );
            }
            let text = |key: &str| oauth.get(key).and_then(Value::as_str).map(String::from);
            sign_in.client_id = text("clientId");
            sign_in.client_secret = text("clientSecret");
            sign_in.redirect_port = match oauth.get("callbackPort") {
                None => None,
                Some(port) => match port.as_u64().and_then(|p| u16::try_from(p).ok()) {
                    Some(port) => Some(port),
                    None => return Err("its oauth.callbackPort is not a port number".into()),
                },
            };
            if sign_in.client_secret.is_some() && sign_in.client_id.is_none() {
                return Err("its oauth has a clientSecret but no clientId".into());
            }
            sign_in.keys.push("oauth".into());
        }
        Some(Value::Bool(_)) => sign_in.keys.push("oauth".into()),
        Some(_) => return Err("its oauth is neither an object nor true/false".into()),
    }
    Ok((!sign_in.keys.is_empty()).then_some(sign_in))
}

/// Why a remote entry cannot be put behind the proxy, if it cannot.
pub(super) fn unsupported(
    obj: &serde_json::Map<String, Value>,
    client: Client,
    has_url: bool,
) -> Option<String> {
    let kind = obj.get("type").and_then(Value::as_str);
    if kind == Some("sse") || (client == Client::GeminiCli && !has_url && obj.contains_key("url")) {
        return Some(
            "it uses the legacy SSE transport; mcp-budget --upstream speaks Streamable HTTP".into(),
        );
    }
    if let Some(kind) = kind
        && !matches!(
            kind,
            "http" | "streamable-http" | "streamableHttp" | "remote" | "stdio" | "local"
        )
    {
        return Some(format!("its type {kind:?} is not one mcp-budget can reach"));
    }
    if has_url && obj.get("auth").is_some_and(Value::is_object) {
        return Some(
            "it signs in with OAuth through the client, which the proxy cannot do for it".into(),
        );
    }
    None
}
