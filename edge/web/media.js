// Images attached to the next message, and voice recorded for the speech model, both kept in the browser
// until the message or the transcription request carries them.
"use strict";

const Media = (() => {
  const images = [];  // data: URLs of the images attached to the message being written.

  const readAsDataUrl = (file) => new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });

  function thumbnail(url, onRemove) {
    const figure = document.createElement("figure");
    figure.className = "thumb";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "Attached image";
    figure.append(img);
    if (onRemove) {
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove image");
      remove.addEventListener("click", onRemove);
      figure.append(remove);
    }
    return figure;
  }

  function paint() {
    const box = document.getElementById("attachments");
    box.replaceChildren(...images.map((url, index) => thumbnail(url, () => {
      images.splice(index, 1);
      paint();
    })));
  }

  async function add(files) {
    for (const file of files) {
      if (file.type.startsWith("image/")) images.push(await readAsDataUrl(file));
    }
    paint();
  }

  // The attached images, handed over once: the composer is cleared for the next message.
  function take() {
    const taken = images.splice(0);
    paint();
    return taken;
  }

  // Recording: MediaRecorder's WebM, decoded by the browser and sent as 16 kHz mono WAV, which the
  // speech model reads without ffmpeg (docs/speech.md).
  let recorder = null;

  async function startRecording() {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const chunks = [];
    const recording = new MediaRecorder(stream);
    recorder = recording;
    const stopped = new Promise((resolve) => {
      recording.onstop = () => {
        stream.getTracks().forEach((track) => track.stop());
        resolve(new Blob(chunks, { type: recording.mimeType }));
      };
    });
    recording.ondataavailable = (event) => {
      chunks.push(event.data);
      // How much is recorded so far, for a person's eye (the button) and a test's wait.
      document.getElementById("mic").dataset.seconds = String(chunks.length / 4);
    };
    recording.start(250);
    return stopped;
  }

  function stopRecording() {
    if (recorder && recorder.state !== "inactive") recorder.stop();
    recorder = null;
  }

  async function wav(blob) {
    const decoded = await new AudioContext().decodeAudioData(await blob.arrayBuffer());
    const rate = 16000;
    const offline = new OfflineAudioContext(1, Math.max(1, Math.ceil(decoded.duration * rate)), rate);
    const source = offline.createBufferSource();
    source.buffer = decoded;
    source.connect(offline.destination);
    source.start();
    const samples = (await offline.startRendering()).getChannelData(0);
    const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
    const ascii = (offset, text) => [...text].forEach((c, i) => view.setUint8(offset + i, c.charCodeAt(0)));
    ascii(0, "RIFF");
    view.setUint32(4, 36 + samples.length * 2, true);
    ascii(8, "WAVEfmt ");
    view.setUint32(16, 16, true);
    view.setUint16(20, 1, true);
    view.setUint16(22, 1, true);
    view.setUint32(24, rate, true);
    view.setUint32(28, rate * 2, true);
    view.setUint16(32, 2, true);
    view.setUint16(34, 16, true);
    ascii(36, "data");
    view.setUint32(40, samples.length * 2, true);
    samples.forEach((sample, i) => view.setInt16(44 + i * 2, Math.max(-1, Math.min(1, sample)) * 0x7fff, true));
    return new Blob([view], { type: "audio/wav" });
  }

  return { add, take, thumbnail, startRecording, stopRecording, wav, count: () => images.length };
})();
