// Demo client for POST /reply with a server-side session. No framework, no build step.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const form = $("composer");
  const input = $("message");
  const sendButton = $("send");
  const list = $("messages");
  const conversation = $("conversation");
  const emptyHint = $("empty-hint");
  const errorLine = $("error");
  const announcer = $("announcer");
  const sessionLabel = $("session-id");
  const indexLabel = $("index-version");
  const modelLabel = $("model-name");
  const tagFilter = $("tag-filter");
  const setPicker = $("set-picker");
  const languagePicker = $("language-picker");

  const REQUEST_TIMEOUT_MS = 15000;
  let sessionId = "";
  let inflight = null; // AbortController of the request in flight, if any

  function newSessionId() {
    const bytes = crypto.getRandomValues(new Uint8Array(8));
    return "demo-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    // textContent, never innerHTML: replies are corpus text that admins can upload.
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const score = (value) => value.toFixed(3);

  // Hangul syllables and jamo: such a line is marked Korean, so the browser picks a Korean font and a
  // screen reader a Korean voice. Anything else keeps the page's language.
  const HANGUL = /[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]/;
  function textNode(tag, className, value) {
    const node = el(tag, className, value);
    if (HANGUL.test(value)) node.lang = "ko";
    return node;
  }

  function showError(message) {
    errorLine.textContent = message;
    errorLine.hidden = !message;
  }

  function scrollToEnd() {
    conversation.scrollTop = conversation.scrollHeight;
  }

  function addMessage(item) {
    emptyHint.hidden = true;
    list.append(item);
    scrollToEnd();
    return item;
  }

  function userMessage(message) {
    const item = el("li", "msg user");
    item.append(el("span", "visually-hidden", "You: "), textNode("p", "text", message));
    return item;
  }

  function botMessage(body) {
    const item = el("li", "msg bot");
    item.append(el("span", "visually-hidden", "Bot: "), textNode("p", "text", body.reply));

    const meta = el("p", "meta");
    meta.append(el("span", "source", body.source), el("span", "score", "score " + score(body.score)));
    if (typeof body.confidence === "number") {
      meta.append(el("span", "confidence", "confidence " + Math.round(body.confidence * 100) + "%"));
    }
    if (body.reranked) meta.append(el("span", "reranked", "reranked"));
    item.append(meta);

    if (body.candidates.length) {
      const details = el("details", "candidates");
      details.open = true;
      details.append(el("summary", "", "Top candidates (" + body.candidates.length + ")"));
      const ranked = el("ol");
      for (const c of body.candidates) {
        const row = el("li", c.id === body.id ? "candidate chosen" : "candidate");
        row.append(textNode("span", "candidate-text", c.text));
        const info = el("span", "candidate-meta");
        info.append(el("span", "score", score(c.score)), el("span", "source", c.source));
        if (c.id === body.id) info.append(el("span", "chosen-mark", "chosen"));
        row.append(info);
        ranked.append(row);
      }
      details.append(ranked);
      item.append(details);
    }
    return item;
  }

  // The error body is {"error": {"message": ...}}; a proxy in between may send anything else.
  async function errorMessage(response) {
    let message = "";
    try {
      message = (await response.json()).error.message;
    } catch {
      message = "";
    }
    message = (message || "HTTP " + response.status).replace(/\.$/, "");
    if (response.status === 429) {
      const wait = response.headers.get("Retry-After");
      return message + ". The service is busy: please retry " + (wait ? "in " + wait + " s." : "later.");
    }
    // 503: still loading, or no index yet; either passes with time.
    return response.status === 503 ? message + ". Please retry later." : message;
  }

  // The request body: the session's next message, the tag filter if one is typed, and the language
  // of the replies if one is picked (none: the message's own).
  function replyBody(forSession, message) {
    const body = { session_id: forSession, message, k: 5 };
    const tags = [...new Set(tagFilter.value.split(",").map((t) => t.trim()).filter(Boolean))];
    const filter = {};
    if (tags.length) filter.tags_any = tags;
    if (languagePicker.value) filter.language = languagePicker.value;
    if (Object.keys(filter).length) body.filter = filter;
    if (setPicker.value !== "default") body.set = setPicker.value;
    return body;
  }

  async function send(text) {
    const forSession = sessionId;
    const controller = new AbortController();
    inflight = controller;
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    const sent = addMessage(userMessage(text));
    const thinking = addMessage(el("li", "msg bot thinking", "…"));
    thinking.setAttribute("aria-hidden", "true");
    try {
      const response = await fetch("reply", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(replyBody(forSession, text)),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      const body = await response.json();
      // Only the newest reply keeps its candidates open, so a phone screen shows the conversation.
      for (const open of list.querySelectorAll("details[open]")) open.open = false;
      thinking.replaceWith(botMessage(body));
      const otherSet = body.set && body.set !== "default";
      indexLabel.textContent = otherSet ? body.set + " " + body.index_version : body.index_version;
      announcer.textContent = "Bot: " + body.reply;
      scrollToEnd();
    } catch (err) {
      if (forSession !== sessionId) return; // aborted by "New conversation": nothing to show
      sent.remove();
      thinking.remove();
      if (!list.children.length) emptyHint.hidden = false;
      input.value = input.value || text; // give the message back so it can be resent
      const reason = err.name === "AbortError" ? "No answer from the service in time; please retry."
        : err instanceof TypeError ? "Could not reach the service; please retry." : err.message;
      showError(reason);
    } finally {
      clearTimeout(timer);
      if (inflight === controller) inflight = null;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || inflight) return;
    sendButton.disabled = true;
    showError("");
    input.value = "";
    input.focus(); // a click on Send moved focus to the button
    await send(text);
    sendButton.disabled = false;
  });

  function startConversation() {
    if (inflight) inflight.abort(); // its reply belongs to the old session
    sessionId = newSessionId();
    sessionLabel.textContent = sessionId;
    list.replaceChildren();
    emptyHint.hidden = false;
    announcer.textContent = "";
    showError("");
  }

  $("new-conversation").addEventListener("click", () => {
    startConversation();
    announcer.textContent = "New conversation started.";
    input.focus();
  });

  async function loadInfo() {
    try {
      const response = await fetch("info");
      if (!response.ok) throw new Error(await errorMessage(response));
      const info = await response.json();
      modelLabel.textContent = info.model.name;
      // A reply may already have filled in the version it was answered from.
      if (indexLabel.textContent === "…") indexLabel.textContent = info.index.version;
    } catch (err) {
      modelLabel.textContent = "unknown";
      showError("Could not load service info: " + err.message);
    }
  }

  // The sets this replica serves, from /readyz (public, unlike /admin/sets); "default" stays if it fails.
  async function loadSets() {
    try {
      const response = await fetch("readyz");
      const sets = Object.keys((await response.json()).sets || {}).filter((name) => name !== "default").sort();
      setPicker.append(...sets.map((name) => {
        const option = el("option", "", name);
        option.value = name;
        return option;
      }));
    } catch {
      // The picker keeps "default"; a reply names the set it came from anyway.
    }
  }

  // Another set is another bot: its conversation starts afresh.
  setPicker.addEventListener("change", () => {
    startConversation();
    input.focus();
  });

  startConversation();
  loadInfo();
  loadSets();
  input.focus();
})();
