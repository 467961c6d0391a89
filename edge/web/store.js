// Conversations kept in this browser's IndexedDB, and their export as files. Nothing here talks to the
// server: a conversation leaves the browser only as the chat requests themselves.
"use strict";

const Store = (() => {
  const DB = "mlx-relay";
  const CHATS = "chats";
  let opened = null;

  function open() {
    if (!opened) {
      opened = new Promise((resolve, reject) => {
        const request = indexedDB.open(DB, 1);
        request.onupgradeneeded = () => request.result.createObjectStore(CHATS, { keyPath: "id" });
        request.onsuccess = () => resolve(request.result);
        request.onerror = () => reject(request.error);
      });
    }
    return opened;
  }

  async function run(mode, work) {
    const db = await open();
    return new Promise((resolve, reject) => {
      const transaction = db.transaction(CHATS, mode);
      const request = work(transaction.objectStore(CHATS));
      transaction.oncomplete = () => resolve(request.result);
      transaction.onerror = () => reject(transaction.error);
    });
  }

  // Newest first.
  async function all() {
    const chats = await run("readonly", (chats) => chats.getAll());
    return chats.sort((a, b) => b.updated - a.updated);
  }

  const put = (chat) => run("readwrite", (chats) => chats.put(chat));
  const remove = (id) => run("readwrite", (chats) => chats.delete(id));

  function text(content) {
    if (typeof content === "string") return content;
    return content.filter((part) => part.type === "text").map((part) => part.text).join("\n");
  }

  function markdown(chat) {
    const lines = [`# ${chat.title}`, ""];
    for (const message of chat.messages) {
      lines.push(`## ${message.role === "user" ? "User" : "Assistant"}`, "");
      if (message.reasoning) lines.push(...message.reasoning.split("\n").map((line) => `> ${line}`), "");
      lines.push(text(message.content), "");
      const images = typeof message.content === "string" ? 0 : message.content.length - 1;
      if (images > 0) lines.push(`(${images} image(s) attached)`, "");
    }
    return lines.join("\n");
  }

  function download(name, body, type) {
    const url = URL.createObjectURL(new Blob([body], { type }));
    const link = document.createElement("a");
    link.href = url;
    link.download = name;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  function fileName(chat, suffix) {
    const stem = chat.title.replace(/[^\w -]+/g, "").trim().replace(/\s+/g, "-").slice(0, 40) || "conversation";
    return `${stem}.${suffix}`;
  }

  function exportAs(chat, format) {
    if (format === "md") download(fileName(chat, "md"), markdown(chat), "text/markdown");
    else download(fileName(chat, "json"), JSON.stringify(chat, null, 2), "application/json");
  }

  return { all, put, remove, exportAs, text };
})();
