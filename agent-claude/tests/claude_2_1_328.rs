//! Claude Code 2.1.328, as it really ran against a scripted model: the history side of
//! what it writes (the delivery proof, the rows) for a message that joined a running
//! turn, messages merged into one turn (live and saved), a message cancelled while
//! queued, and the interruption marker.
//!
//! Every line is copied from the captures of those runs (the stream-json output and
//! the transcript of the same run). Lines marked `// abbreviated` lost their large
//! fields (an attachment keeps only its type, a request line its IDs); nothing else
//! was changed.

#![allow(clippy::disallowed_methods)] // writes a transcript file for the file path

use std::collections::BTreeMap;

use agent_claude::file::has_user_entry;
use agent_claude::project::{Output, Projector};
use agent_claude::proof::{history_read, proves_delivery};
use agent_claude::stream::{MessageUuid, StreamDecoder};
use agent_claude::transcript::{ItemKind, Transcript};
use outbox_core::adapter::HistoryRead;
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType, OperationId};
use timeline_core::time::Millis;

const A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
const C: &str = "cccccccc-0000-4000-8000-00000000000c";

/// `midturn_prompt`: A runs a Bash call that waits for permission; B is sent while it
/// waits and is absorbed into A's turn. The transcript, whole.
const MIDTURN_TRANSCRIPT: &[&str] = &[
    r#"{"type":"queue-operation","operation":"enqueue","timestamp":"2026-12-02T05:34:15.403Z","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","content":"First. [[tool]]"}"#,
    r#"{"type":"queue-operation","operation":"dequeue","timestamp":"2026-12-02T05:34:15.405Z","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"parentUuid":null,"isSidechain":false,"promptId":"94ebb3a8-40ab-4f24-97f8-f1999a7b607e","type":"user","message":{"role":"user","content":"First. [[tool]]"},"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T05:34:15.458Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":1},"turnAttributionKey":"aaaaaaaa-0000-4000-8000-00000000000a","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"aaaaaaaa-0000-4000-8000-00000000000a","isSidechain":false,"attachment":{"type":"environment"},"type":"attachment","uuid":"61c03d69-96f7-4480-be68-84379a339129","timestamp":"2026-12-02T05:34:15.456Z"}"#,
    // abbreviated
    r#"{"parentUuid":"61c03d69-96f7-4480-be68-84379a339129","isSidechain":false,"attachment":{"type":"model"},"type":"attachment","uuid":"b12d8ab2-8763-498d-8f91-c74f950ade66","timestamp":"2026-12-02T05:34:15.456Z"}"#,
    // abbreviated
    r#"{"parentUuid":"b12d8ab2-8763-498d-8f91-c74f950ade66","isSidechain":false,"attachment":{"type":"deferred_tools_delta"},"type":"attachment","uuid":"75711dd8-a39c-4062-a7ab-bed33182a3a5","timestamp":"2026-12-02T05:34:15.456Z"}"#,
    // abbreviated
    r#"{"parentUuid":"75711dd8-a39c-4062-a7ab-bed33182a3a5","isSidechain":false,"attachment":{"type":"agent_listing_delta"},"type":"attachment","uuid":"9763dd27-d65d-4d55-8a80-810c07e31dd6","timestamp":"2026-12-02T05:34:15.456Z"}"#,
    // abbreviated
    r#"{"parentUuid":"9763dd27-d65d-4d55-8a80-810c07e31dd6","isSidechain":false,"attachment":{"type":"skill_listing"},"type":"attachment","uuid":"c0dbf781-1874-47ba-be2c-732a56a29767","timestamp":"2026-12-02T05:34:15.456Z"}"#,
    r#"{"type":"atis-latch","atis":"","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    // abbreviated
    r#"{"parentUuid":"c0dbf781-1874-47ba-be2c-732a56a29767","isSidechain":false,"attachment":{"type":"session_context"},"type":"attachment","uuid":"00eaf17e-83e6-4cbd-88d1-55a8b3325561","timestamp":"2026-12-02T05:34:15.489Z"}"#,
    // abbreviated
    r#"{"parentUuid":"00eaf17e-83e6-4cbd-88d1-55a8b3325561","isSidechain":false,"attachment":{"type":"date"},"type":"attachment","uuid":"deadcace-b622-4026-9219-3a933ee2c792","timestamp":"2026-12-02T05:34:15.490Z"}"#,
    // abbreviated
    r#"{"parentUuid":"deadcace-b622-4026-9219-3a933ee2c792","isSidechain":false,"attachment":{"type":"remote_session_change"},"type":"attachment","uuid":"672f7917-4050-48d2-b6d5-7c2ae5759c4a","timestamp":"2026-12-02T05:34:15.492Z"}"#,
    // abbreviated
    r#"{"parentUuid":"672f7917-4050-48d2-b6d5-7c2ae5759c4a","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"951d3bd1-c7f6-4da8-8543-16fe648abe18","timestamp":"2026-12-02T05:34:15.493Z"}"#,
    // abbreviated
    r#"{"type":"api-request-shape","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","shapeHash":"87bb0b90795413192e58bba673b85df5a49a98da1fd113dcb91878a907f7e82f","timestamp":"2026-12-02T05:34:15.535Z","version":"2.1.328","shape":{}}"#,
    // abbreviated
    r#"{"type":"api-request-blob","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","hash":"40d62ada90fcaf214a0fb06de54fca923deeaf805688153262799cb344edec52","message":{}}"#,
    // abbreviated
    r#"{"type":"api-request-blob","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","hash":"cbddd5f9ffaf071f62f8f28274d1f7773aced14831b6506440246cbf452392ad","message":{}}"#,
    // abbreviated
    r#"{"type":"api-request","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","id":"6b5bdce1-db98-4606-969e-e7f6abb80b54","timestamp":"2026-12-02T05:34:15.535Z","version":"2.1.328","querySource":"sdk","shapeHash":"87bb0b90795413192e58bba673b85df5a49a98da1fd113dcb91878a907f7e82f","params":{},"keep":0,"tail":[],"cacheControl":{},"requestDigest":"051e8371a47011ffaba85e69fbc62a2edcec5d0f4a2650004d01bb854dea8f72"}"#,
    r#"{"type":"last-prompt","lastPrompt":"First. [[tool]]","leafUuid":"951d3bd1-c7f6-4da8-8543-16fe648abe18","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"type":"atis-latch","atis":"","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"type":"tools-used","tools":["Bash"],"sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"parentUuid":"951d3bd1-c7f6-4da8-8543-16fe648abe18","isSidechain":false,"message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Running it."}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"apiBlockIndex":0,"requestId":"req_stub_001","requestRef":"6b5bdce1-db98-4606-969e-e7f6abb80b54","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"6ec718d4-8cd6-4939-84a9-79845f57adff","timestamp":"2026-12-02T05:34:15.694Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"parentUuid":"6ec718d4-8cd6-4939-84a9-79845f57adff","isSidechain":false,"message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"toolu_stub_001","name":"Bash","input":{"command":"touch stub-made.txt && echo made-it","description":"Echo a word"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"toolInputStreamMs":152,"apiBlockIndex":1,"requestId":"req_stub_001","requestRef":"6b5bdce1-db98-4606-969e-e7f6abb80b54","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"73fa90cb-f914-47ff-9612-5c15eab5f1f0","timestamp":"2026-12-02T05:34:15.896Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"type":"queue-operation","operation":"enqueue","timestamp":"2026-12-02T05:34:16.945Z","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","content":"Second while the prompt waits. [[text]]"}"#,
    r#"{"parentUuid":"73fa90cb-f914-47ff-9612-5c15eab5f1f0","isSidechain":false,"promptId":"94ebb3a8-40ab-4f24-97f8-f1999a7b607e","type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_stub_001","type":"tool_result","content":"made-it","is_error":false}]},"uuid":"68e7d285-069d-4f7a-8b1a-835ba85c7be3","timestamp":"2026-12-02T05:34:19.000Z","toolUseResult":{"stdout":"made-it","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false},"sandboxed":false,"sourceToolAssistantUUID":"73fa90cb-f914-47ff-9612-5c15eab5f1f0","permissionDecision":{"decision":"accept","source":"user_temporary","grantScope":"once","reasonCode":"unknown"},"userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"68e7d285-069d-4f7a-8b1a-835ba85c7be3","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"04b4415e-aea5-4fdc-a02c-fa9aa255a307","timestamp":"2026-12-02T05:34:19.005Z"}"#,
    r#"{"type":"queue-operation","operation":"remove","timestamp":"2026-12-02T05:34:19.017Z","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","content":"Second while the prompt waits. [[text]]","reason":"absorbed_mid_turn","commandUuid":"bbbbbbbb-0000-4000-8000-00000000000b","deliveryId":"709b8e28-15d4-4f82-8a21-d84707565a58"}"#,
    r#"{"parentUuid":"04b4415e-aea5-4fdc-a02c-fa9aa255a307","isSidechain":false,"attachment":{"type":"queued_command","prompt":"Second while the prompt waits. [[text]]","source_uuid":"bbbbbbbb-0000-4000-8000-00000000000b","delivery_id":"709b8e28-15d4-4f82-8a21-d84707565a58","commandMode":"prompt","timestamp":"2026-12-02T05:34:16.945Z"},"type":"attachment","uuid":"5ccc89cd-7d27-4261-85cd-dd41d1168855","timestamp":"2026-12-02T05:34:16.945Z","rendered":[{"content":"<system-reminder>\nThe user sent a new message while you were working:\nSecond while the prompt waits. [[text]]\n\nThis is how Claude Code surfaces messages the user sends mid-turn — within the running turn, often alongside the next tool result, rather than as a separate conversation turn. Address the message above as you continue this turn.\n</system-reminder>"}],"renderedRole":"system","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"type":"api-request-blob","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","hash":"48db71e64c06a9be9832b5d6846d159c8045e7b89aa1d4ec8ceb5713f11a5b93","message":{"role":"system","content":[{"type":"text","text":"The user sent a new message while you were working:\nSecond while the prompt waits. [[text]]\n\nThis is how Claude Code surfaces messages the user sends mid-turn — within the running turn, often alongside the next tool result, rather than as a separate conversation turn. Address the message above as you continue this turn."}]}}"#,
    // abbreviated
    r#"{"type":"api-request","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","id":"78dfb38c-a285-4c7d-83d5-76e3febac9fb","timestamp":"2026-12-02T05:34:19.043Z","version":"2.1.328","querySource":"sdk","shapeHash":"87bb0b90795413192e58bba673b85df5a49a98da1fd113dcb91878a907f7e82f","params":{},"base":"6b5bdce1-db98-4606-969e-e7f6abb80b54","keep":2,"tail":[],"cacheControl":{},"requestDigest":"93a9d30639d0229abcdc482725ac1cd3ea9404371dfa42c597aff02c0a41bf88"}"#,
    r#"{"type":"last-prompt","lastPrompt":"First. [[tool]]","leafUuid":"04b4415e-aea5-4fdc-a02c-fa9aa255a307","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"type":"atis-latch","atis":"","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"parentUuid":"5ccc89cd-7d27-4261-85cd-dd41d1168855","isSidechain":false,"message":{"id":"msg_stub_002","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Hello from stub."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":5,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"apiBlockIndex":0,"requestId":"req_stub_002","requestRef":"78dfb38c-a285-4c7d-83d5-76e3febac9fb","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"1fd702a6-59af-4d7a-972d-2ee4f41eb0a1","timestamp":"2026-12-02T05:34:19.292Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/midturn_prompt/proj","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"type":"last-prompt","lastPrompt":"First. [[tool]]","leafUuid":"1fd702a6-59af-4d7a-972d-2ee4f41eb0a1","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa"}"#,
    r#"{"type":"cost-state","sessionId":"343bde8b-da18-4b33-9414-96b522def9aa","totalCostUSD":0.00058,"totalAPIDuration":942,"totalAPIDurationWithoutRetries":936,"totalToolDuration":42,"totalLinesAdded":0,"totalLinesRemoved":0,"totalDuration":64341,"startTime":1796189655126,"modelUsage":{"claude-opus-5-5":{"inputTokens":20,"outputTokens":25,"thinkingTokens":0,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"cacheCreationEphemeral5mInputTokens":0,"cacheCreationEphemeral1hInputTokens":0,"webSearchRequests":0,"costUSD":0.00058}},"hasUnknownModelCost":false}"#,
];

/// `midturn_prompt`: the `user` and `assistant` lines of the stream-json output.
const MIDTURN_STDOUT: &[&str] = &[
    r#"{"type":"user","message":{"role":"user","content":"First. [[tool]]"},"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","parent_tool_use_id":null,"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T05:34:15.458Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Running it."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"context_management":null},"parent_tool_use_id":null,"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","uuid":"6ec718d4-8cd6-4939-84a9-79845f57adff","timestamp":"2026-12-02T05:34:15.694Z","request_id":"req_stub_001","user_message_uuid":"aaaaaaaa-0000-4000-8000-00000000000a","user_message_uuids":["aaaaaaaa-0000-4000-8000-00000000000a"]}"#,
    r#"{"type":"assistant","message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"toolu_stub_001","name":"Bash","input":{"command":"touch stub-made.txt && echo made-it","description":"Echo a word"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"context_management":null},"parent_tool_use_id":null,"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","uuid":"73fa90cb-f914-47ff-9612-5c15eab5f1f0","timestamp":"2026-12-02T05:34:15.896Z","request_id":"req_stub_001"}"#,
    r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_stub_001","type":"tool_result","content":"made-it","is_error":false}]},"parent_tool_use_id":null,"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","uuid":"68e7d285-069d-4f7a-8b1a-835ba85c7be3","timestamp":"2026-12-02T05:34:19.000Z","tool_use_result":{"stdout":"made-it","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false},"tool_result_meta":[{"id":"toolu_stub_001","permission_decision":{"decision":"accept","source":"user_temporary"}}]}"#,
    r#"{"type":"user","message":{"role":"user","content":"Second while the prompt waits. [[text]]"},"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","parent_tool_use_id":null,"uuid":"bbbbbbbb-0000-4000-8000-00000000000b","timestamp":"2026-12-02T05:34:16.945Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"id":"msg_stub_002","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Hello from stub."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"context_management":null},"parent_tool_use_id":null,"session_id":"343bde8b-da18-4b33-9414-96b522def9aa","uuid":"1fd702a6-59af-4d7a-972d-2ee4f41eb0a1","timestamp":"2026-12-02T05:34:19.292Z","request_id":"req_stub_002"}"#,
];

/// `interrupt_queued_slow`: A streams a slow text reply, B is queued behind it, the
/// host interrupts; the marker closes A's turn and B runs as the next one. The chain
/// lines of the transcript (the metadata lines left out).
const INTERRUPT_TRANSCRIPT: &[&str] = &[
    r#"{"parentUuid":null,"isSidechain":false,"promptId":"0b18aa34-7f93-44d1-bcf7-572639e40011","type":"user","message":{"role":"user","content":"First. [[slow]]"},"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T05:35:31.517Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":1},"turnAttributionKey":"aaaaaaaa-0000-4000-8000-00000000000a","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_queued_slow/proj","sessionId":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"aaaaaaaa-0000-4000-8000-00000000000a","isSidechain":false,"attachment":{"type":"environment"},"type":"attachment","uuid":"36f4bd4e-18c5-4b44-81b9-8996e61abc77","timestamp":"2026-12-02T05:35:31.515Z"}"#,
    // abbreviated
    r#"{"parentUuid":"36f4bd4e-18c5-4b44-81b9-8996e61abc77","isSidechain":false,"attachment":{"type":"model"},"type":"attachment","uuid":"606ba3b8-d3ae-4471-9b3d-c70ca6bd2b5a","timestamp":"2026-12-02T05:35:31.515Z"}"#,
    // abbreviated
    r#"{"parentUuid":"606ba3b8-d3ae-4471-9b3d-c70ca6bd2b5a","isSidechain":false,"attachment":{"type":"deferred_tools_delta"},"type":"attachment","uuid":"97603111-ee94-475a-bdfe-49775cb65272","timestamp":"2026-12-02T05:35:31.515Z"}"#,
    // abbreviated
    r#"{"parentUuid":"97603111-ee94-475a-bdfe-49775cb65272","isSidechain":false,"attachment":{"type":"agent_listing_delta"},"type":"attachment","uuid":"56511330-c63a-4b82-8eaa-5a96f17973f4","timestamp":"2026-12-02T05:35:31.515Z"}"#,
    // abbreviated
    r#"{"parentUuid":"56511330-c63a-4b82-8eaa-5a96f17973f4","isSidechain":false,"attachment":{"type":"skill_listing"},"type":"attachment","uuid":"5112db35-b45f-41e9-8f26-7f6fec980b4f","timestamp":"2026-12-02T05:35:31.515Z"}"#,
    // abbreviated
    r#"{"parentUuid":"5112db35-b45f-41e9-8f26-7f6fec980b4f","isSidechain":false,"attachment":{"type":"session_context"},"type":"attachment","uuid":"4b2d41df-2f68-417d-b829-25569279c6d0","timestamp":"2026-12-02T05:35:31.550Z"}"#,
    // abbreviated
    r#"{"parentUuid":"4b2d41df-2f68-417d-b829-25569279c6d0","isSidechain":false,"attachment":{"type":"date"},"type":"attachment","uuid":"237c3794-5e2d-4c5d-97bf-ccfc3e9ea652","timestamp":"2026-12-02T05:35:31.550Z"}"#,
    // abbreviated
    r#"{"parentUuid":"237c3794-5e2d-4c5d-97bf-ccfc3e9ea652","isSidechain":false,"attachment":{"type":"remote_session_change"},"type":"attachment","uuid":"5f9f5f09-ba05-48cc-94b1-938bb531bc1c","timestamp":"2026-12-02T05:35:31.552Z"}"#,
    // abbreviated
    r#"{"parentUuid":"5f9f5f09-ba05-48cc-94b1-938bb531bc1c","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"e6414ad4-6336-43fb-8ca9-0c7d0ab7d561","timestamp":"2026-12-02T05:35:31.555Z"}"#,
    r#"{"parentUuid":"e6414ad4-6336-43fb-8ca9-0c7d0ab7d561","isSidechain":false,"message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"w0 w1 w2 "}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}},"apiBlockIndex":0,"requestId":"req_stub_001","requestRef":"a12d55a1-46e3-45a8-ba23-476df8efdbed","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"d648491d-2d51-4e5d-b26b-e29fcc918165","timestamp":"2026-12-02T05:35:35.220Z","isAbortedMidStream":true,"effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_queued_slow/proj","sessionId":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"parentUuid":"d648491d-2d51-4e5d-b26b-e29fcc918165","isSidechain":false,"promptId":"0b18aa34-7f93-44d1-bcf7-572639e40011","type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]},"uuid":"d26eff5c-a7b5-4adc-b434-4dea95da5b58","timestamp":"2026-12-02T05:35:35.228Z","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_queued_slow/proj","sessionId":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"parentUuid":"d26eff5c-a7b5-4adc-b434-4dea95da5b58","isSidechain":false,"promptId":"44cd12f5-2750-423f-97dc-5efa83426392","type":"user","message":{"role":"user","content":"Second, queued. [[text]]"},"uuid":"bbbbbbbb-0000-4000-8000-00000000000b","timestamp":"2026-12-02T05:35:35.242Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":2},"turnAttributionKey":"bbbbbbbb-0000-4000-8000-00000000000b","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_queued_slow/proj","sessionId":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"parentUuid":"bbbbbbbb-0000-4000-8000-00000000000b","isSidechain":false,"message":{"id":"msg_stub_002","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Hello from stub."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":5,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"apiBlockIndex":0,"requestId":"req_stub_002","requestRef":"9f71d929-8111-4a8b-aff3-69bf93bbe9ad","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"d1f3d43d-030f-4972-a52d-19c21c265b7a","timestamp":"2026-12-02T05:35:35.523Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_queued_slow/proj","sessionId":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"d1f3d43d-030f-4972-a52d-19c21c265b7a","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"14b53730-a725-4b6d-9f36-7ffb80603c89","timestamp":"2026-12-02T05:35:35.681Z"}"#,
];

/// `interrupt_queued_slow`: the `user` and `assistant` lines of the stream-json output.
const INTERRUPT_STDOUT: &[&str] = &[
    r#"{"type":"user","message":{"role":"user","content":"First. [[slow]]"},"session_id":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","parent_tool_use_id":null,"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T05:35:31.517Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"id":"msg_stub_001","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"w0 w1 w2 "}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"context_management":null},"parent_tool_use_id":null,"session_id":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","uuid":"d648491d-2d51-4e5d-b26b-e29fcc918165","timestamp":"2026-12-02T05:35:35.220Z","request_id":"req_stub_001","aborted":true,"user_message_uuid":"aaaaaaaa-0000-4000-8000-00000000000a","user_message_uuids":["aaaaaaaa-0000-4000-8000-00000000000a"]}"#,
    r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]},"parent_tool_use_id":null,"session_id":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","uuid":"d26eff5c-a7b5-4adc-b434-4dea95da5b58","timestamp":"2026-12-02T05:35:35.228Z"}"#,
    r#"{"type":"user","message":{"role":"user","content":"Second, queued. [[text]]"},"session_id":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","parent_tool_use_id":null,"uuid":"bbbbbbbb-0000-4000-8000-00000000000b","timestamp":"2026-12-02T05:35:35.242Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"id":"msg_stub_002","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Hello from stub."}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"context_management":null},"parent_tool_use_id":null,"session_id":"e98c8614-3fa2-4e0d-9225-9f37eeefdd97","uuid":"d1f3d43d-030f-4972-a52d-19c21c265b7a","timestamp":"2026-12-02T05:35:35.523Z","request_id":"req_stub_002","user_message_uuid":"bbbbbbbb-0000-4000-8000-00000000000b","user_message_uuids":["bbbbbbbb-0000-4000-8000-00000000000b"]}"#,
];

/// `two_queued_no_interrupt`: B and C queued behind A's text reply, merged into one
/// turn. The transcript's only entry for them: the user entry C, listing B.
const MERGED_ENTRY: &str = r#"{"parentUuid":"97fead9f-a779-4b69-bfd6-64d38c1b7fb1","isSidechain":false,"promptId":"76ef1ae8-c805-4339-b8e8-550611071ce1","type":"user","message":{"role":"user","content":"Second, queued. [[text]]\nThird, queued. [[text]]"},"uuid":"cccccccc-0000-4000-8000-00000000000c","timestamp":"2026-12-02T05:39:31.711Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":2},"mergedSendUuids":["bbbbbbbb-0000-4000-8000-00000000000b"],"turnAttributionKey":"cccccccc-0000-4000-8000-00000000000c","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/two_queued_no_interrupt/proj","sessionId":"37edc019-62ba-4372-bfe7-a00895be5e91","version":"2.1.328","gitBranch":"HEAD"}"#;

/// `two_queued_no_interrupt`, run again: B and C queued behind A's slow reply and
/// merged into one turn. The stream-json output from A's echo to the merged turn's
/// reply: B's own echo first (no `timestamp`), then C's with both texts.
const MERGED_STDOUT: &[&str] = &[
    r#"{"type":"user","message":{"role":"user","content":"First. [[slow]]"},"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","parent_tool_use_id":null,"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T20:39:39.653Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"content":[{"text":"Reply to: First.","type":"text"}],"id":"msg_1","model":"scripted","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":10,"output_tokens":1},"context_management":null},"parent_tool_use_id":null,"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","uuid":"5069e951-2327-41ec-adb7-83f27a13f24f","timestamp":"2026-12-02T20:39:45.842Z","request_id":"req_scripted","user_message_uuid":"aaaaaaaa-0000-4000-8000-00000000000a","user_message_uuids":["aaaaaaaa-0000-4000-8000-00000000000a"]}"#,
    // abbreviated
    r#"{"type":"result","subtype":"success","is_error":false,"stop_reason":"end_turn","session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","user_message_uuid":"aaaaaaaa-0000-4000-8000-00000000000a","uuid":"857a88ca-2e5f-4ab8-a2ee-43c0e516d0f4"}"#,
    r#"{"type":"command_lifecycle","command_uuid":"aaaaaaaa-0000-4000-8000-00000000000a","state":"completed","uuid":"61c1d346-bd40-4ef9-97f1-13eaace1fd65","session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b"}"#,
    r#"{"type":"user","message":{"role":"user","content":"Second, queued. [[text]]"},"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","parent_tool_use_id":null,"uuid":"bbbbbbbb-0000-4000-8000-00000000000b","isReplay":true}"#,
    r#"{"type":"command_lifecycle","command_uuid":"bbbbbbbb-0000-4000-8000-00000000000b","state":"started","uuid":"21df1879-91be-4cb6-9518-e5030fc3a236","session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b"}"#,
    r#"{"type":"command_lifecycle","command_uuid":"cccccccc-0000-4000-8000-00000000000c","state":"started","uuid":"c88e3b4d-abfb-4c62-84c9-529dead731e3","session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b"}"#,
    // abbreviated
    r#"{"type":"system","subtype":"init","cwd":"/tmp/explore/claudehome-23750/project","session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","uuid":"fb00dce4-825e-4602-aa63-6553b8ec57c2","claude_code_version":"2.1.328"}"#,
    r#"{"type":"user","message":{"role":"user","content":"Second, queued. [[text]]\nThird, queued. [[text]]"},"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","parent_tool_use_id":null,"uuid":"cccccccc-0000-4000-8000-00000000000c","timestamp":"2026-12-02T20:39:45.977Z","isReplay":true}"#,
    r#"{"type":"assistant","message":{"content":[{"text":"Reply to: Second, queued. Third, queued. [[text]]","type":"text"}],"id":"msg_2","model":"scripted","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":10,"output_tokens":1},"context_management":null},"parent_tool_use_id":null,"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","uuid":"0eab9fea-fb5b-44e3-b7fe-9f4a49f0108d","timestamp":"2026-12-02T20:39:46.080Z","request_id":"req_scripted","user_message_uuid":"cccccccc-0000-4000-8000-00000000000c","user_message_uuids":["bbbbbbbb-0000-4000-8000-00000000000b","cccccccc-0000-4000-8000-00000000000c"]}"#,
];

/// The chain lines of the same run's transcript (its metadata lines left out): A, its
/// reply, and the one entry of the merged turn, under C, listing B.
const MERGED_TRANSCRIPT: &[&str] = &[
    r#"{"parentUuid":null,"isSidechain":false,"promptId":"c73094b6-f34b-4877-8d41-fc8188156da2","type":"user","message":{"role":"user","content":"First. [[slow]]"},"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T20:39:39.653Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":1},"turnAttributionKey":"aaaaaaaa-0000-4000-8000-00000000000a","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore/claudehome-23750/project","sessionId":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"aaaaaaaa-0000-4000-8000-00000000000a","isSidechain":false,"attachment":{"type":"environment"},"type":"attachment","uuid":"13cc0130-2b1f-443f-8bc2-1ed279b473bd","timestamp":"2026-12-02T20:39:39.649Z"}"#,
    // abbreviated
    r#"{"parentUuid":"13cc0130-2b1f-443f-8bc2-1ed279b473bd","isSidechain":false,"attachment":{"type":"model"},"type":"attachment","uuid":"aeba2ec7-b206-4a06-a30d-14578a75d90e","timestamp":"2026-12-02T20:39:39.649Z"}"#,
    // abbreviated
    r#"{"parentUuid":"aeba2ec7-b206-4a06-a30d-14578a75d90e","isSidechain":false,"attachment":{"type":"deferred_tools_delta"},"type":"attachment","uuid":"800f9c49-4ca0-4ed8-be9a-3a738a008212","timestamp":"2026-12-02T20:39:39.649Z"}"#,
    // abbreviated
    r#"{"parentUuid":"800f9c49-4ca0-4ed8-be9a-3a738a008212","isSidechain":false,"attachment":{"type":"agent_listing_delta"},"type":"attachment","uuid":"a5cd17bd-3e52-4768-afe5-bed28976b9a2","timestamp":"2026-12-02T20:39:39.650Z"}"#,
    // abbreviated
    r#"{"parentUuid":"a5cd17bd-3e52-4768-afe5-bed28976b9a2","isSidechain":false,"attachment":{"type":"skill_listing"},"type":"attachment","uuid":"cce935fc-6d2b-4fe4-ae68-f6a0079cf053","timestamp":"2026-12-02T20:39:39.650Z"}"#,
    // abbreviated
    r#"{"parentUuid":"cce935fc-6d2b-4fe4-ae68-f6a0079cf053","isSidechain":false,"attachment":{"type":"session_context"},"type":"attachment","uuid":"5353b503-689a-4f63-acb7-60581ed6a6c1","timestamp":"2026-12-02T20:39:39.714Z"}"#,
    // abbreviated
    r#"{"parentUuid":"5353b503-689a-4f63-acb7-60581ed6a6c1","isSidechain":false,"attachment":{"type":"date"},"type":"attachment","uuid":"5fb15d8c-94d9-4925-be95-84f1de03dfe3","timestamp":"2026-12-02T20:39:39.714Z"}"#,
    // abbreviated
    r#"{"parentUuid":"5fb15d8c-94d9-4925-be95-84f1de03dfe3","isSidechain":false,"attachment":{"type":"remote_session_change"},"type":"attachment","uuid":"a66a9e54-f0e9-48eb-9ee2-a65f741e9ac5","timestamp":"2026-12-02T20:39:39.718Z"}"#,
    // abbreviated
    r#"{"parentUuid":"a66a9e54-f0e9-48eb-9ee2-a65f741e9ac5","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"f4d7f49e-2b2e-4c52-9c66-07efba6083cc","timestamp":"2026-12-02T20:39:39.721Z"}"#,
    r#"{"parentUuid":"f4d7f49e-2b2e-4c52-9c66-07efba6083cc","isSidechain":false,"message":{"content":[{"text":"Reply to: First.","type":"text"}],"id":"msg_1","model":"scripted","role":"assistant","stop_reason":"end_turn","stop_sequence":null,"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":5,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"apiBlockIndex":0,"requestId":"req_scripted","requestRef":"f46be7a7-07fc-47ae-b610-52de93983463","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"5069e951-2327-41ec-adb7-83f27a13f24f","timestamp":"2026-12-02T20:39:45.842Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore/claudehome-23750/project","sessionId":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","version":"2.1.328","gitBranch":"HEAD"}"#,
    // abbreviated
    r#"{"parentUuid":"5069e951-2327-41ec-adb7-83f27a13f24f","isSidechain":false,"attachment":{"type":"prompt_snapshot"},"type":"attachment","uuid":"c9746514-66f9-4fe5-a572-19692dabb76d","timestamp":"2026-12-02T20:39:45.891Z"}"#,
    r#"{"parentUuid":"c9746514-66f9-4fe5-a572-19692dabb76d","isSidechain":false,"promptId":"7af0c1dd-a389-4469-8443-cbbcaf791e56","type":"user","message":{"role":"user","content":"Second, queued. [[text]]\nThird, queued. [[text]]"},"uuid":"cccccccc-0000-4000-8000-00000000000c","timestamp":"2026-12-02T20:39:45.977Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":2},"mergedSendUuids":["bbbbbbbb-0000-4000-8000-00000000000b"],"turnAttributionKey":"cccccccc-0000-4000-8000-00000000000c","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore/claudehome-23750/project","sessionId":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"parentUuid":"cccccccc-0000-4000-8000-00000000000c","isSidechain":false,"message":{"content":[{"text":"Reply to: Second, queued. Third, queued. [[text]]","type":"text"}],"id":"msg_2","model":"scripted","role":"assistant","stop_reason":"end_turn","stop_sequence":null,"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":5,"output_tokens_details":{"thinking_tokens":0},"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard","fallback_credit":null},"stop_details":null},"apiBlockIndex":0,"requestId":"req_scripted","requestRef":"bbdd1a8d-82fa-480b-af90-8e858ce48c0d","requestedModel":"claude-opus-5-5","promptCacheRequested":"5m","type":"assistant","uuid":"0eab9fea-fb5b-44e3-b7fe-9f4a49f0108d","timestamp":"2026-12-02T20:39:46.080Z","effort":"medium","perTurnEffort":"medium","madeBy":"model","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore/claudehome-23750/project","sessionId":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","version":"2.1.328","gitBranch":"HEAD"}"#,
];

/// `interrupt_cancel_queued`: B queued, then an interrupt with `cancel_queued: true`
/// drops it. The lines of the transcript that name B, and the marker.
const CANCELLED_TRANSCRIPT: &[&str] = &[
    r#"{"parentUuid":null,"isSidechain":false,"promptId":"ddec13d7-22a7-4568-a85f-26a94b75f805","type":"user","message":{"role":"user","content":"First. [[slow]]"},"uuid":"aaaaaaaa-0000-4000-8000-00000000000a","timestamp":"2026-12-02T05:39:17.272Z","permissionMode":"default","promptSource":"sdk","turnOrigin":"sdk","turnPosition":{"promptIndex":0,"turnIndex":1},"turnAttributionKey":"aaaaaaaa-0000-4000-8000-00000000000a","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_cancel_queued/proj","sessionId":"b68a3ae5-2a18-4aed-ae6e-215b1c213824","version":"2.1.328","gitBranch":"HEAD"}"#,
    r#"{"type":"queue-operation","operation":"enqueue","timestamp":"2026-12-02T05:39:19.430Z","sessionId":"b68a3ae5-2a18-4aed-ae6e-215b1c213824","content":"Second, queued. [[text]]"}"#,
    r#"{"type":"queue-operation","operation":"remove","timestamp":"2026-12-02T05:39:20.431Z","sessionId":"b68a3ae5-2a18-4aed-ae6e-215b1c213824","content":"Second, queued. [[text]]","reason":"cleared_on_cancel","commandUuid":"bbbbbbbb-0000-4000-8000-00000000000b"}"#,
    r#"{"parentUuid":"4ac05169-a660-4151-9713-2468fe1c55c8","isSidechain":false,"promptId":"ddec13d7-22a7-4568-a85f-26a94b75f805","type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]},"uuid":"1ed73aa9-4cd0-4534-9161-66f09e7d4150","timestamp":"2026-12-02T05:39:20.438Z","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_cancel_queued/proj","sessionId":"b68a3ae5-2a18-4aed-ae6e-215b1c213824","version":"2.1.328","gitBranch":"HEAD"}"#,
];

/// `interrupt_prompt`: the interrupt lands while a permission prompt waits. The marker
/// on stdout, and its transcript entry.
const TOOL_USE_MARKER_STDOUT: &str = r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user for tool use]"}]},"parent_tool_use_id":null,"session_id":"e168428a-b89b-4903-97bd-e62666a80780","uuid":"2ba01e34-ad70-4681-b12f-8327073fa540","timestamp":"2026-12-02T05:36:01.852Z"}"#;
const TOOL_USE_MARKER_ENTRY: &str = r#"{"parentUuid":"65a77e90-3e5d-49e6-bfc3-ac8a76d147c5","isSidechain":false,"promptId":"3ea238e4-590b-4ad3-9717-48a93e74e855","type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user for tool use]"}]},"uuid":"2ba01e34-ad70-4681-b12f-8327073fa540","timestamp":"2026-12-02T05:36:01.852Z","userType":"external","entrypoint":"sdk-cli","cwd":"/tmp/explore-claude/runs/interrupt_prompt/proj","sessionId":"e168428a-b89b-4903-97bd-e62666a80780","version":"2.1.328","gitBranch":"HEAD"}"#;

fn bytes(lines: &[&str]) -> Vec<u8> {
    let mut s = lines.join("\n");
    s.push('\n');
    s.into_bytes()
}

fn transcript(lines: &[&str]) -> Transcript {
    let b = bytes(lines);
    let mut t = Transcript::new();
    assert_eq!(t.feed(&b), b.len());
    t
}

/// The history read of `uuid` through every path that decides it, which must agree:
/// the reader's [`history_read`], the file scan [`has_user_entry`] (the adapter's) and
/// the line test [`proves_delivery`] (the seam's).
fn read_everywhere(lines: &[&str], uuid: &str) -> HistoryRead {
    let uuid = MessageUuid::parse(uuid).expect("a UUID");
    let whole = history_read(&transcript(lines), &uuid);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("session.jsonl");
    std::fs::write(&path, bytes(lines)).expect("written");
    let scanned = has_user_entry(&path, &uuid).expect("read");

    let by_line = lines.iter().any(|l| proves_delivery(l.as_bytes(), &uuid));

    assert_eq!(
        whole == HistoryRead::Found,
        scanned,
        "{uuid:?}: the file scan"
    );
    assert_eq!(scanned, by_line, "{uuid:?}: the line test");
    whole
}

fn saved_rows(t: &Transcript) -> BTreeMap<String, Block> {
    t.blocks()
        .into_iter()
        .map(|b| (b.key().encoded(), b))
        .collect()
}

fn live_rows(lines: &[&str]) -> BTreeMap<String, Block> {
    let mut dec = StreamDecoder::new();
    let mut p = Projector::new("s", 0);
    for l in lines {
        let line = dec.decode(l.as_bytes()).expect("a stream-json line");
        p.handle_line(&line, Millis(1));
    }
    let mut rows = BTreeMap::new();
    while let Some(o) = p.poll_effect() {
        if let Output::Row(b) = o {
            rows.insert(b.key().encoded(), b);
        }
    }
    rows
}

fn user_key(uuid: &str) -> String {
    BlockKey::user_message(&OperationId::new(uuid).expect("an operation ID")).encoded()
}

fn system_key(uuid: &str) -> String {
    BlockKey::parse(BlockType::System, uuid)
        .expect("a key")
        .encoded()
}

/// What a row shows, without where it is placed (the live and the saved copy of a row
/// are placed differently).
fn shown(rows: &BTreeMap<String, Block>) -> BTreeMap<String, (Option<String>, serde_json::Value)> {
    rows.iter()
        .map(|(k, b)| {
            let op = b.operation_id.as_ref().map(|o| o.as_str().to_owned());
            (k.clone(), (op, b.data.clone()))
        })
        .collect()
}

// OB-08: a message absorbed into a running turn has no user entry of its own; its
// `queued_command` attachment and its `absorbed_mid_turn` queue removal prove it
// delivered, on every path that reads history.
#[test]
fn a_message_absorbed_mid_turn_is_found() {
    // AG-01
    assert_eq!(read_everywhere(MIDTURN_TRANSCRIPT, A), HistoryRead::Found);
    assert_eq!(read_everywhere(MIDTURN_TRANSCRIPT, B), HistoryRead::Found);
    // Each of the two lines is a proof on its own.
    let attachment = MIDTURN_TRANSCRIPT
        .iter()
        .find(|l| l.contains(r#""type":"queued_command""#))
        .expect("the attachment");
    let removal = MIDTURN_TRANSCRIPT
        .iter()
        .find(|l| l.contains("absorbed_mid_turn"))
        .expect("the removal");
    assert_eq!(read_everywhere(&[attachment], B), HistoryRead::Found);
    assert_eq!(read_everywhere(&[removal], B), HistoryRead::Found);
    assert_eq!(
        read_everywhere(&[removal], &B.to_uppercase()),
        HistoryRead::Found
    );
    assert_eq!(read_everywhere(MIDTURN_TRANSCRIPT, C), HistoryRead::Missing);
}

// OB-08: messages merged into one turn are one user entry under the last UUID; every
// UUID it lists in `mergedSendUuids` is delivered too.
#[test]
fn every_message_of_a_merged_entry_is_found() {
    assert_eq!(read_everywhere(&[MERGED_ENTRY], C), HistoryRead::Found);
    assert_eq!(read_everywhere(&[MERGED_ENTRY], B), HistoryRead::Found);
    assert_eq!(read_everywhere(&[MERGED_ENTRY], A), HistoryRead::Missing);
}

// OB-08: a queued message the interrupt cleared (`cleared_on_cancel`) never reached the
// conversation: its queue removal names it, but proves nothing.
#[test]
fn a_message_cleared_from_the_queue_is_missing() {
    assert_eq!(read_everywhere(CANCELLED_TRANSCRIPT, A), HistoryRead::Found);
    assert_eq!(
        read_everywhere(CANCELLED_TRANSCRIPT, B),
        HistoryRead::Missing
    );
}

// TL-01, TL-03: after a reload the absorbed message is still the user's row: its
// attachment becomes the row keyed by the message's operation, the twin of the row its
// live echo gave, with the same words. The 2.1.328 metadata lines are known and give no
// row.
#[test]
fn an_absorbed_message_is_a_user_row_live_and_saved() {
    let t = transcript(MIDTURN_TRANSCRIPT);
    let d = t.diagnostics();
    assert!(d.all_understood(), "{d:?}");
    for kind in [
        "atis-latch",
        "api-request-shape",
        "api-request-blob",
        "api-request",
        "tools-used",
        "queue-operation",
        "last-prompt",
        "cost-state",
    ] {
        assert!(d.skipped.get(kind) > 0, "{kind} is skipped as metadata");
    }
    assert_eq!(d.accounted(), d.lines);

    let absorbed: Vec<&ItemKind> = t
        .visible_items()
        .map(|(_, i)| &i.kind)
        .filter(|k| matches!(k, ItemKind::Absorbed { .. }))
        .collect();
    assert_eq!(
        absorbed,
        [&ItemKind::Absorbed {
            uuid: B.to_owned(),
            text: "Second while the prompt waits. [[text]]".to_owned(),
        }]
    );

    let saved = saved_rows(&t);
    let live = live_rows(MIDTURN_STDOUT);
    let row = &saved[&user_key(B)];
    assert_eq!(row.operation_id.as_ref().map(|o| o.as_str()), Some(B));
    assert_eq!(row.data["text"], "Second while the prompt waits. [[text]]");
    // Every live row has its saved twin, with the same words.
    assert_eq!(shown(&live), shown(&saved));
    // The saved rows are in the order of the conversation: A, the call, B, the reply.
    let mut order: Vec<&Block> = saved.values().collect();
    order.sort_by_key(|b| b.order_key());
    let keys: Vec<String> = order.iter().map(|b| b.key().encoded()).collect();
    let at = |k: &str| keys.iter().position(|x| x == k).expect(k);
    assert!(at(&user_key(A)) < at(&user_key(B)));
    let reply = BlockKey::parse(BlockType::AgentReply, "msg_stub_002")
        .expect("a key")
        .encoded();
    assert!(at(&user_key(B)) < at(&reply));
}

// TL-01: the interruption marker is no user message: live and saved it is the system
// row "Interrupted" (the words Codex shows for an interrupted turn), keyed by the
// marker's UUID, and it carries no operation. The message queued behind the
// interrupted turn keeps its user row.
#[test]
fn the_interruption_marker_is_the_interrupted_row_live_and_saved() {
    const MARKER: &str = "d26eff5c-a7b5-4adc-b434-4dea95da5b58";
    let t = transcript(INTERRUPT_TRANSCRIPT);
    assert!(t.diagnostics().all_understood(), "{:?}", t.diagnostics());
    let saved = saved_rows(&t);
    let live = live_rows(INTERRUPT_STDOUT);
    for rows in [&saved, &live] {
        assert!(!rows.contains_key(&user_key(MARKER)));
        let row = &rows[&system_key(MARKER)];
        assert_eq!(row.data, serde_json::json!({"text": "Interrupted"}));
        assert_eq!(row.operation_id, None);
        assert!(rows.contains_key(&user_key(A)) && rows.contains_key(&user_key(B)));
    }
    assert_eq!(shown(&live), shown(&saved));
    assert_eq!(
        t.visible_items()
            .filter(|(_, i)| matches!(i.kind, ItemKind::Interrupted { .. }))
            .count(),
        1
    );
    let uuid = MessageUuid::parse(B).expect("a UUID");
    assert_eq!(history_read(&t, &uuid), HistoryRead::Found);

    // The marker written while a prompt waited reads the same.
    const TOOL_MARKER: &str = "2ba01e34-ad70-4681-b12f-8327073fa540";
    let saved = saved_rows(&transcript(&[TOOL_USE_MARKER_ENTRY]));
    let live = live_rows(&[TOOL_USE_MARKER_STDOUT]);
    assert_eq!(shown(&live), shown(&saved));
    assert_eq!(
        shown(&live).into_keys().collect::<Vec<_>>(),
        [system_key(TOOL_MARKER)]
    );
    assert_eq!(live[&system_key(TOOL_MARKER)].data["text"], "Interrupted");

    // The transcript of a cancelled queue ends with the marker too.
    let saved = saved_rows(&transcript(CANCELLED_TRANSCRIPT));
    assert_eq!(
        saved[&system_key("1ed73aa9-4cd0-4534-9161-66f09e7d4150")].data["text"],
        "Interrupted"
    );
}

// TL-01, TL-02: messages merged into one turn are one row live as in history: the
// merged message's key, the merged words, once. B's own echo (2.1.328 replays it
// without a `timestamp` before the merged one) gives no row of its own; it still
// proves B delivered.
#[test]
fn merged_messages_are_one_row_live_and_saved() {
    // AG-01
    let t = transcript(MERGED_TRANSCRIPT);
    let saved = saved_rows(&t);
    let live = live_rows(MERGED_STDOUT);
    assert_eq!(shown(&live), shown(&saved));
    assert!(!live.contains_key(&user_key(B)), "{:?}", live.keys());
    let row = &live[&user_key(C)];
    assert_eq!(row.operation_id.as_ref().map(|o| o.as_str()), Some(C));
    assert_eq!(
        row.data["text"],
        "Second, queued. [[text]]\nThird, queued. [[text]]"
    );
    let said = live
        .values()
        .filter(|b| b.operation_id.is_some() && b.data.to_string().contains("Second, queued."))
        .count();
    assert_eq!(
        said, 1,
        "the earlier text is shown once among the user rows"
    );
    // The live rows come in the conversation's order: A, its reply, the merged turn.
    let mut order: Vec<&Block> = live.values().collect();
    order.sort_by_key(|b| b.order_key());
    let keys: Vec<String> = order.iter().map(|b| b.key().encoded()).collect();
    let at = |k: &str| keys.iter().position(|x| x == k).expect(k);
    let reply = |id: &str| {
        BlockKey::parse(BlockType::AgentReply, id)
            .expect("a key")
            .encoded()
    };
    assert!(at(&user_key(A)) < at(&reply("msg_1")));
    assert!(at(&reply("msg_1")) < at(&user_key(C)));
    assert!(at(&user_key(C)) < at(&reply("msg_2")));
    // B's echo still proves it delivered.
    let mut dec = StreamDecoder::new();
    let b = MessageUuid::parse(B).expect("a UUID");
    assert!(MERGED_STDOUT.iter().any(|l| {
        let line = dec.decode(l.as_bytes()).expect("a stream-json line");
        agent_claude::proof::evidence(&line).is_some_and(|e| e.uuid == b.as_str())
    }));
    assert_eq!(read_everywhere(MERGED_TRANSCRIPT, B), HistoryRead::Found);
}

// TL-02: an echo held back for a merge that does not come is still shown, before
// whatever follows it: the next reply, an echo that does not carry its words, the end
// of the process.
#[test]
fn an_echo_no_merge_carries_is_still_shown_once() {
    let b_echo = MERGED_STDOUT
        .iter()
        .find(|l| l.contains(B) && l.contains(r#""type":"user""#))
        .expect("B's echo");
    let reply = MERGED_STDOUT
        .iter()
        .find(|l| l.contains("msg_2"))
        .expect("the reply");
    let other = r#"{"type":"user","message":{"role":"user","content":"Something else"},"session_id":"7c2e9a41-3b5d-4f60-8a1b-2c3d4e5f6a7b","parent_tool_use_id":null,"uuid":"cccccccc-0000-4000-8000-00000000000c","timestamp":"2026-12-02T20:39:45.977Z","isReplay":true}"#;
    for (case, lines) in [
        ("a reply", vec![*b_echo, *reply]),
        ("an echo of other words", vec![*b_echo, other]),
    ] {
        let rows = live_rows(&lines);
        assert_eq!(
            rows[&user_key(B)].data["text"],
            "Second, queued. [[text]]",
            "{case}"
        );
        let mut order: Vec<&Block> = rows.values().collect();
        order.sort_by_key(|b| b.order_key());
        assert_eq!(order[0].key().encoded(), user_key(B), "{case}: shown first");
    }
    // The process ends right after it.
    let mut dec = StreamDecoder::new();
    let mut p = Projector::new("s", 0);
    p.handle_line(&dec.decode(b_echo.as_bytes()).expect("a line"), Millis(1));
    let rows = |p: &mut Projector| {
        std::iter::from_fn(|| p.poll_effect())
            .filter(|o| matches!(o, Output::Row(_)))
            .count()
    };
    assert_eq!(rows(&mut p), 0, "held");
    p.flush();
    assert_eq!(rows(&mut p), 1, "shown at the end");
}
