// Where a function lives (file and line), read from a pprof profile: the flame graph JSON
// carries names only, the pprof the server exports (SelectMergeProfile, a span's profile)
// carries Function.filename/start_line and each location's Line.line.
//
// A reader of just the protobuf the pprof needs, so the UI takes no dependency: the function
// table, the lines, the string table.  hotspan's agent records the line each frame was on,
// not where the function starts (start_line is 0), so a function's line is its first sampled
// line, the one nearest its "def".

function reader(bytes) {
  let pos = 0;
  const varint = () => {
    let result = 0;
    let shift = 0;
    for (;;) {
      if (pos >= bytes.length) throw new Error("truncated protobuf");
      const b = bytes[pos++];
      // Multiplication, not <<: values above 2^31 (negative int64) stay numbers.
      result += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return result;
      shift += 7;
    }
  };
  return {
    get done() {
      return pos >= bytes.length;
    },
    varint,
    /** [field, wireType, value]: value is a number (varint) or a Uint8Array (bytes). */
    next() {
      const key = varint();
      const field = Math.floor(key / 8);
      const wire = key & 7;
      if (wire === 0) return [field, wire, varint()];
      if (wire === 2) {
        const n = varint();
        if (pos + n > bytes.length) throw new Error("truncated protobuf: a field runs past the end");
        const value = bytes.subarray(pos, pos + n);
        pos += n;
        return [field, wire, value];
      }
      if (wire === 1) {
        pos += 8;
        return [field, wire, null];
      }
      if (wire === 5) {
        pos += 4;
        return [field, wire, null];
      }
      throw new Error(`unsupported protobuf wire type ${wire}`);
    },
  };
}

function fields(bytes, onField) {
  const r = reader(bytes);
  while (!r.done) {
    const [field, wire, value] = r.next();
    onField(field, wire, value);
  }
}

async function gunzip(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/**
 * The source location of each function in a pprof profile (gzip-compressed or not).
 * @param {ArrayBuffer|Uint8Array} data
 * @returns {Promise<Map<string, {file: string, line: number}>>} by function name
 */
export async function sourceLocations(data) {
  let bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) bytes = await gunzip(bytes);
  const strings = [];
  const functions = new Map(); // id -> {name, file, start}
  const lines = new Map(); // function id -> smallest line seen
  const decoder = new TextDecoder();
  fields(bytes, (field, wire, value) => {
    if (field === 6 && wire === 2) {
      strings.push(decoder.decode(value));
    } else if (field === 5 && wire === 2) {
      const fn = { id: 0, name: 0, file: 0, start: 0 };
      fields(value, (f, w, v) => {
        if (w !== 0) return;
        if (f === 1) fn.id = v;
        else if (f === 2) fn.name = v;
        else if (f === 4) fn.file = v;
        else if (f === 5) fn.start = v;
      });
      functions.set(fn.id, fn);
    } else if (field === 4 && wire === 2) {
      fields(value, (f, w, v) => {
        if (f !== 4 || w !== 2) return;
        let id = 0;
        let line = 0;
        fields(v, (lf, lw, lv) => {
          if (lw !== 0) return;
          if (lf === 1) id = lv;
          else if (lf === 2) line = lv;
        });
        if (line > 0 && (!lines.has(id) || line < lines.get(id))) lines.set(id, line);
      });
    }
  });
  const out = new Map();
  for (const fn of functions.values()) {
    const name = strings[fn.name] || "";
    const file = strings[fn.file] || "";
    if (!name || !file || out.has(name)) continue;
    out.set(name, { file, line: fn.start || lines.get(fn.id) || 0 });
  }
  return out;
}

/** "path:line" (just the path when the line is unknown). */
export function formatLocation({ file, line }) {
  return line ? `${file}:${line}` : file;
}

/** A link that opens the file at the line in VS Code (other editors register their own). */
export function editorLink({ file, line }) {
  const path = file.startsWith("/") ? file : `/${file}`;
  // encodeURI leaves "#" and "?" (a C# project's c#/ folder) to end the path.
  const encoded = encodeURI(path).replace(/[#?]/g, (c) => (c === "#" ? "%23" : "%3F"));
  return `vscode://file${encoded}${line ? `:${line}` : ""}`;
}
