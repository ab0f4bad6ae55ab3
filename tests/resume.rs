//! Resumable event streams over `--listen` (Streamable HTTP, 2025-11-25): event ids, the
//! priming event, `Last-Event-ID` replay after a dropped stream, SSE polling, and the clear
//! refusals when a resume cannot be honoured. The quirky server sits behind the proxy.

mod common;

use std::collections::HashSet;

use futures_util::StreamExt;
use serde_json::{Value, json};

const INITIALIZE_2025_11_25: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"resume-test","version":"0"}}}"#;

fn quirky() -> String {
    common::example("quirky_server")
        .to_str()
        .unwrap()
        .to_string()
}

async fn listen(options: &[&str]) -> (tokio::process::Child, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let quirky = quirky();
    let mut args: Vec<&str> = options.to_vec();
    args.extend(["--", &quirky]);
    common::listen(&args, &[]).await
}

/// A session on protocol 2025-11-25 (its id).
async fn initialize(client: &reqwest::Client, url: &str) -> String {
    common::mcp_initialize_with(client, url, INITIALIZE_2025_11_25).await
}

/// One event as the client sees it.
#[derive(Debug)]
struct Event {
    id: Option<String>,
    retry: Option<u64>,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {:?}", self.data))
    }
}

type Events = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send>,
>;

fn events(response: reqwest::Response) -> Events {
    Box::pin(sse_stream::SseStream::from_bytes_stream(
        response.bytes_stream(),
    ))
}

/// The next event; `None` when the stream ended.
async fn next(events: &mut Events) -> Option<Event> {
    let event = tokio::time::timeout(common::PATIENCE, events.next())
        .await
        .expect("an event in time")?
        .expect("a well-formed event");
    Some(Event {
        id: event.id,
        retry: event.retry,
        data: event.data.unwrap_or_default(),
    })
}

/// GET with `Last-Event-ID` (retried on 409, which the proxy should no longer answer: it
/// takes a stream over from a connection it has not yet seen go).
async fn resume(
    client: &reqwest::Client,
    url: &str,
    session: &str,
    last: &str,
) -> reqwest::Response {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let response = common::mcp_get(client, url, session, Some(last)).await;
        if response.status() != 409 || tokio::time::Instant::now() > deadline {
            return response;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// POST of one message on the session.
async fn post(client: &reqwest::Client, url: &str, session: &str, body: &str) -> reqwest::Response {
    common::mcp_post(client, url, Some(session), body)
        .send()
        .await
        .unwrap()
}

/// "stream-seq" → (stream, seq).
fn parse_id(id: &str) -> (u64, u64) {
    let (stream, seq) = id.split_once('-').expect("an id stream-seq");
    (stream.parse().unwrap(), seq.parse().unwrap())
}

#[tokio::test]
async fn a_dropped_stream_is_resumed_from_last_event_id_with_nothing_lost_and_nothing_twice() {
    let (_proxy, url) = listen(&[]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    let call = r#"{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{"name":"report","arguments":{"quarter":"Q3"},"_meta":{"progressToken":"p"}}}"#;
    let response = post(&client, &url, &session, call).await;
    assert_eq!(response.status(), 200);
    let mut first = events(response);
    // The priming event: an id, a retry, empty data.
    let priming = next(&mut first).await.unwrap();
    let (stream, seq) = parse_id(priming.id.as_deref().unwrap());
    assert_eq!(seq, 0);
    assert_eq!(priming.retry, Some(1000));
    assert_eq!(priming.data, "");
    let one = next(&mut first).await.unwrap();
    assert_eq!(one.json()["params"]["progress"], 1);
    assert_eq!(parse_id(one.id.as_deref().unwrap()), (stream, 1));
    // The connection drops: what followed progress 1 (sent or not) must come again, once.
    drop(first);
    let resumed = resume(&client, &url, &session, one.id.as_deref().unwrap()).await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = events(resumed);
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    while let Some(event) = next(&mut resumed).await {
        if event.data.trim().is_empty() {
            continue;
        }
        ids.push(event.id.clone().expect("every event has an id"));
        let message = event.json();
        if message["method"] == "sampling/createMessage" {
            let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "fine"}, "model": "m"}});
            let ack = post(&client, &url, &session, &answer.to_string()).await;
            assert_eq!(ack.status(), 202);
        }
        seen.push(message);
    }
    let kinds: Vec<String> = seen
        .iter()
        .map(|m| match (&m["method"], &m["id"]) {
            (Value::String(method), _) if method == "notifications/progress" => {
                format!("progress {}", m["params"]["progress"])
            }
            (Value::String(method), _) => method.clone(),
            (_, id) => format!("response {id}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "progress 2",
            "notifications/message",
            "sampling/createMessage",
            "progress 3",
            "response \"r1\""
        ]
    );
    assert_eq!(seen[4]["result"]["content"][0]["text"], "Q3: fine café");
    // The ids go on from where the client was, on the same stream, without a repeat.
    let numbers: Vec<(u64, u64)> = ids.iter().map(|id| parse_id(id)).collect();
    assert!(numbers.iter().all(|&(s, _)| s == stream), "{ids:?}");
    assert_eq!(
        numbers.iter().map(|&(_, n)| n).collect::<Vec<_>>(),
        [2, 3, 4, 5, 6]
    );
}

#[tokio::test]
async fn a_stream_not_resumed_within_the_window_is_cancelled_upstream() {
    let (_proxy, url) = listen(&["--resume-secs", "0.3"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // The GET stream gets what belongs to no open request: the server's log of the cancel.
    let get = common::mcp_get(&client, &url, &session, None).await;
    let mut server = events(get);
    let call = r#"{"jsonrpc":"2.0","id":"w1","method":"tools/call","params":{"name":"slow"}}"#;
    let response = post(&client, &url, &session, call).await;
    let mut stream = events(response);
    let priming = next(&mut stream).await.unwrap();
    assert_eq!(priming.data, "");
    drop(stream);
    let logged = loop {
        let event = next(&mut server).await.expect("the GET stream stays open");
        if !event.data.trim().is_empty() {
            break event.json();
        }
    };
    assert_eq!(logged["params"]["data"], "cancelled 'w1'");
    // Resuming it now is refused, and says why.
    let late = resume(&client, &url, &session, priming.id.as_deref().unwrap()).await;
    assert_eq!(late.status(), 410);
    let body: Value = late.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        format!(
            "the stream of event {:?} was not resumed within --resume-secs: its requests were cancelled; send them again",
            priming.id.unwrap()
        )
    );
}

#[tokio::test]
async fn with_stream_secs_the_proxy_ends_long_streams_and_a_polling_client_gets_everything_once() {
    let (_proxy, url) = listen(&["--stream-secs", "0.25"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // Progress every 100 ms, eight times, then the answer: longer than three streams.
    let call = r#"{"jsonrpc":"2.0","id":"t1","method":"tools/call","params":{"name":"ticking","arguments":{"ticks":8},"_meta":{"progressToken":"tk"}}}"#;
    let response = post(&client, &url, &session, call).await;
    let mut stream = events(response);
    let mut last = None;
    let mut progress = Vec::new();
    let mut answers = 0;
    let mut streams = 0;
    let mut ids = HashSet::new();
    loop {
        streams += 1;
        while let Some(event) = next(&mut stream).await {
            let id = event.id.clone().expect("every event has an id");
            assert!(ids.insert(id.clone()), "event {id} came twice");
            last = Some(id);
            if event.data.trim().is_empty() {
                continue;
            }
            let message = event.json();
            if message["id"] == "t1" {
                answers += 1;
            } else {
                progress.push(message["params"]["progress"].as_u64().unwrap());
            }
        }
        if answers > 0 {
            break;
        }
        assert!(streams < 50, "no answer after {streams} streams");
        // The stream ended before the answer: resume it where it stopped.
        let response = resume(&client, &url, &session, last.as_deref().unwrap()).await;
        assert_eq!(response.status(), 200);
        stream = events(response);
    }
    assert_eq!(answers, 1);
    assert_eq!(progress, (1..=8).collect::<Vec<u64>>());
    assert!(streams >= 2, "the proxy never ended the stream");
}

#[tokio::test]
async fn the_get_stream_is_numbered_and_resumed_too() {
    let (_proxy, url) = listen(&[]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    let call = |id: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{{"name":"list_changed"}}}}"#
        )
    };
    let mut get = events(common::mcp_get(&client, &url, &session, None).await);
    // A GET stream opens with its priming event too.
    let priming = next(&mut get).await.unwrap();
    assert_eq!((priming.data.as_str(), priming.retry), ("", Some(1000)));
    assert_eq!(parse_id(priming.id.as_deref().unwrap()).1, 0);
    let _ = post(&client, &url, &session, &call("l1"))
        .await
        .text()
        .await;
    // tools/list_changed belongs to no request: it goes to the GET stream, with an id.
    let changed = next(&mut get).await.unwrap();
    assert_eq!(changed.json()["method"], "notifications/tools/list_changed");
    let (stream, seq) = parse_id(changed.id.as_deref().unwrap());
    assert_eq!(seq, 1);
    drop(get);
    // Reconnecting from before it: it comes again, then the new GET stream goes on.
    let mut again = events(
        resume(&client, &url, &session, &format!("{stream}-0"))
            .await
            .error_for_status()
            .unwrap(),
    );
    let replayed = next(&mut again).await.unwrap();
    assert_eq!(replayed.id, changed.id);
    assert_eq!(replayed.data, changed.data);
    // Then the new stream's own priming event: an idle client resumes from it, not the old id.
    let primed = next(&mut again).await.unwrap();
    assert_eq!(primed.data, "");
    let (new_stream, seq) = parse_id(primed.id.as_deref().unwrap());
    assert_eq!(seq, 0);
    assert_ne!(new_stream, stream);
    let _ = post(&client, &url, &session, &call("l2"))
        .await
        .text()
        .await;
    let fresh = next(&mut again).await.unwrap();
    assert_eq!(fresh.json()["method"], "notifications/tools/list_changed");
    assert_eq!(parse_id(fresh.id.as_deref().unwrap()), (new_stream, 1));
}

#[tokio::test]
async fn a_resume_the_proxy_cannot_honour_is_refused_with_the_reason() {
    let (_proxy, url) = listen(&["--replay-bytes", "500"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // An id this session never sent.
    let unknown = resume(&client, &url, &session, "999-1").await;
    assert_eq!(unknown.status(), 400);
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "Last-Event-ID \"999-1\" is not an event this session sent; open the stream without it"
    );
    // Not ASCII: not an id this proxy could have sent.
    let odd = client
        .get(&url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header(
            "last-event-id",
            reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(odd.status(), 400);
    // An answer larger than the replay log is sent but cannot be sent again.
    let call = r#"{"jsonrpc":"2.0","id":"b1","method":"tools/call","params":{"name":"big","arguments":{"bytes":2000}}}"#;
    let response = post(&client, &url, &session, call).await;
    let mut stream = events(response);
    let priming = next(&mut stream).await.unwrap();
    let answer = next(&mut stream).await.unwrap();
    assert_eq!(answer.json()["id"], "b1");
    assert!(next(&mut stream).await.is_none());
    let lost = resume(&client, &url, &session, priming.id.as_deref().unwrap()).await;
    assert_eq!(lost.status(), 410);
    let body: Value = lost.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        format!(
            "the events after {:?} are no longer held (each session keeps its latest events up to --replay-bytes); they cannot be sent again",
            priming.id.unwrap()
        )
    );
}

#[tokio::test]
async fn older_clients_get_no_priming_event_and_a_version_header_of_another_known_version_is_accepted()
 {
    let (_proxy, url) = listen(&[]).await;
    let client = reqwest::Client::new();
    // 2025-06-18: no priming event (such clients cannot resume a cut POST stream).
    let old = common::mcp_initialize(&client, &url).await;
    let call = r#"{"jsonrpc":"2.0","id":"o1","method":"tools/call","params":{"name":"late","arguments":{"ms":1,"bytes":3}}}"#;
    let response = common::mcp_post(&client, &url, Some(&old), call)
        .send()
        .await
        .unwrap();
    let mut stream = events(response);
    let first = next(&mut stream).await.unwrap();
    assert_eq!(first.json()["id"], "o1");
    assert!(first.id.is_some());
    // A 2025-11-25 session that sends an older known version in the header is served.
    let new = initialize(&client, &url).await;
    let response = common::mcp_post(&client, &url, Some(&new), call)
        .header("mcp-protocol-version", "2025-03-26")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = events(response);
    assert_eq!(next(&mut stream).await.unwrap().data, "");
    assert_eq!(next(&mut stream).await.unwrap().json()["id"], "o1");
}

#[tokio::test]
async fn a_resume_takes_over_a_stream_whose_old_connection_still_looks_open() {
    let (_proxy, url) = listen(&[]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // Progress every 100 ms, six times: the old connection stays open, unread, meanwhile.
    let call = r#"{"jsonrpc":"2.0","id":"k1","method":"tools/call","params":{"name":"ticking","arguments":{"ticks":6},"_meta":{"progressToken":"kt"}}}"#;
    let response = post(&client, &url, &session, call).await;
    let mut old = events(response);
    let priming = next(&mut old).await.unwrap();
    let first = next(&mut old).await.unwrap();
    assert_eq!(first.json()["params"]["progress"], 1);
    // Not dropped: a frozen client, or one whose network changed.
    let taken = common::mcp_get(&client, &url, &session, first.id.as_deref()).await;
    assert_eq!(
        taken.status(),
        200,
        "a resume is not refused while the old connection lingers"
    );
    let mut taken = events(taken);
    let mut progress = Vec::new();
    let mut answered = 0;
    while let Some(event) = next(&mut taken).await {
        if event.data.is_empty() {
            continue;
        }
        let message = event.json();
        if message["id"] == "k1" {
            answered += 1;
        } else {
            progress.push(message["params"]["progress"].as_u64().unwrap());
        }
    }
    assert_eq!(progress, [2, 3, 4, 5, 6]);
    assert_eq!(answered, 1);
    // The old connection's stream ended when the new one took over.
    let mut rest = 0;
    while next(&mut old).await.is_some() {
        rest += 1;
    }
    assert!(rest <= 5, "the old stream went on after the takeover");
    let _ = priming;
}

#[tokio::test]
async fn a_get_stream_resumed_under_a_flood_loses_nothing_and_repeats_nothing() {
    let (_proxy, url) = listen(&["--replay-bytes", "100000000"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    let get = common::mcp_get(&client, &url, &session, None).await;
    let mut get = events(get);
    // The flood's log notifications belong to no stream in particular: the GET stream.
    let call = r#"{"jsonrpc":"2.0","id":"f1","method":"tools/call","params":{"name":"flood","arguments":{"count":3000,"bytes":200}}}"#;
    let post = post(&client, &url, &session, call).await;
    let mut post = events(post);
    let mut seen = Vec::new();
    let mut last = None;
    while seen.len() < 500 {
        let event = next(&mut get).await.unwrap();
        last = event.id.clone();
        if !event.data.is_empty() {
            seen.push(event.data);
        }
    }
    // Gone mid-flood, and back at once from the last event it read.
    drop(get);
    let resumed = resume(&client, &url, &session, last.as_deref().unwrap()).await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = events(resumed);
    // The answer comes on the call's stream once the flood is written. While no GET stream
    // was open (between the drop and the resume), log messages may have gone there too.
    let mut answered = false;
    while let Some(event) = next(&mut post).await {
        if event.data.is_empty() {
            continue;
        }
        if event.json()["id"] == "f1" {
            answered = true;
        } else {
            seen.push(event.data);
        }
    }
    assert!(answered);
    while seen.len() < 3000 {
        let event = next(&mut resumed).await.expect("the rest of the flood");
        if !event.data.is_empty() {
            seen.push(event.data);
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(seen.len(), 3000);
    assert_eq!(unique.len(), 3000, "a log message came twice");
}

#[tokio::test]
async fn an_answer_for_a_given_up_stream_goes_to_no_other_stream() {
    let (_proxy, url) = listen(&["--resume-secs", "1"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // c1 is cut before its answer (300 ms), which then waits in its parked stream; the window
    // passes while h1 (queued behind it at the server) is still open.
    let cut = r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"late","arguments":{"ms":300,"bytes":3}}}"#;
    let response = post(&client, &url, &session, cut).await;
    let mut stream = events(response);
    assert_eq!(next(&mut stream).await.unwrap().data, "");
    drop(stream);
    let hold = r#"{"jsonrpc":"2.0","id":"h1","method":"tools/call","params":{"name":"late","arguments":{"ms":1500,"bytes":3}}}"#;
    let held = post(&client, &url, &session, hold).await;
    let mut held = events(held);
    // The held call's stream gets its own answer, and only that.
    let mut ids = Vec::new();
    while let Some(event) = next(&mut held).await {
        if !event.data.is_empty() {
            ids.push(event.json()["id"].clone());
        }
    }
    assert_eq!(ids, [json!("h1")]);
}

#[test]
fn a_duration_past_a_year_is_a_clear_usage_error() {
    let quirky = quirky();
    let out = common::run([
        "--listen",
        "http://127.0.0.1:0/mcp",
        "--stream-secs",
        "1e19",
        "--",
        quirky.as_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "mcp-budget: --stream-secs 10000000000000000000: give a positive number of seconds, at most 31536000"
    );
}

#[tokio::test]
async fn an_older_client_cannot_take_over_a_live_stream_and_it_goes_on() {
    let (_proxy, url) = listen(&[]).await;
    let client = reqwest::Client::new();
    // 2025-06-18: its streams cannot be parked, so they are not taken over.
    let session = common::mcp_initialize(&client, &url).await;
    let call = r#"{"jsonrpc":"2.0","id":"o1","method":"tools/call","params":{"name":"ticking","arguments":{"ticks":4},"_meta":{"progressToken":"ot"}}}"#;
    let mut stream = events(post(&client, &url, &session, call).await);
    let first = next(&mut stream).await.unwrap();
    assert_eq!(first.json()["params"]["progress"], 1);
    let refused = common::mcp_get(&client, &url, &session, first.id.as_deref()).await;
    assert_eq!(refused.status(), 409);
    // The live stream was not touched: the rest of its progress, then its answer.
    let mut rest = Vec::new();
    while let Some(event) = next(&mut stream).await {
        rest.push(event.json());
    }
    assert_eq!(rest.len(), 4, "{rest:?}");
    assert_eq!(rest[3]["id"], "o1");
}

#[tokio::test]
async fn a_get_stream_whose_client_stopped_reading_does_not_stall_the_session_once_replaced() {
    let (_proxy, url) = listen(&["--replay-bytes", "100000000"]).await;
    let client = reqwest::Client::new();
    let session = initialize(&client, &url).await;
    // The client reads the GET stream's priming event, then stops reading, without closing.
    let mut stalled = events(common::mcp_get(&client, &url, &session, None).await);
    let priming = next(&mut stalled).await.unwrap();
    assert_eq!(priming.data, "");
    // 30 MB of log messages: more than the stream's queue and the socket buffers hold.
    let call = r#"{"jsonrpc":"2.0","id":"s1","method":"tools/call","params":{"name":"flood","arguments":{"count":3000,"bytes":10000}}}"#;
    let mut flood = events(post(&client, &url, &session, call).await);
    // Time for the flood to fill the unread stream (its queue and socket buffers), so that the
    // session waits on it. (On a slower machine less is queued; the checks hold either way.)
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    // It resumes on a new connection; the old one is still open.
    let resumed = resume(&client, &url, &session, priming.id.as_deref().unwrap()).await;
    assert_eq!(resumed.status(), 200);
    let mut resumed = events(resumed);
    // How many the resumed stream must bring (fewer if some went to the call's stream).
    let (wanted_tx, mut wanted) = tokio::sync::watch::channel(3000usize);
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        while seen.len() < *wanted.borrow_and_update() {
            tokio::select! {
                event = next(&mut resumed) => {
                    let event = event.expect("the resumed stream stays open");
                    if !event.data.is_empty() {
                        seen.push(event.data);
                    }
                }
                _ = wanted.changed() => {}
            }
        }
        seen
    });
    // The session goes on: the flood is written and answered while the old stream is unread.
    let mut answered = false;
    let mut on_post = Vec::new();
    while let Some(event) = next(&mut flood).await {
        if event.data.is_empty() {
            continue;
        }
        if event.json()["id"] == "s1" {
            answered = true;
        } else {
            on_post.push(event.data);
        }
    }
    assert!(answered, "the flood's answer never came");
    // (The reader may be done already.)
    let _ = wanted_tx.send(3000 - on_post.len());
    // What the old stream held comes once its connection goes.
    drop(stalled);
    let mut seen = reader.await.unwrap();
    seen.extend(on_post);
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), 3000, "lost or repeated log messages");
}
