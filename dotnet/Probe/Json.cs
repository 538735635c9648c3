// The JSON of the boundary with Python (optcheck/torchsharp_bridge/worker.py): Setup's configuration
// comes in as one JSON object, Probe's snapshot body goes out as one. C# 7, no JSON library: TorchSharp
// targets netstandard2.0, whose facade (the one Mono's mcs compiles against here) has no
// System.Text.Json, and the two documents are small and flat (docs/dotnet.md, "The boundary").
//
// Output is strict JSON (RFC 8259) that Python's json.loads reads: numbers in the invariant culture
// with round-trip precision ("R"), non-finite doubles as the strings "nan" / "inf" / "-inf" (the run
// directory's one encoding, docs/run-directory.md; optcheck/torchsharp_bridge/convert.py turns them
// back into floats), strings escaped per RFC 8259 (control characters as \u00XX).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    /// <summary>Writes one JSON document into a StringBuilder; commas are placed by the writer.</summary>
    internal sealed class JsonWriter
    {
        readonly StringBuilder sb;
        bool needComma;

        public JsonWriter(StringBuilder sb) { this.sb = sb; }
        public JsonWriter() : this(new StringBuilder(4096)) { }

        void Sep()
        {
            if (needComma) sb.Append(',');
            needComma = true;
        }

        public JsonWriter BeginObject() { Sep(); sb.Append('{'); needComma = false; return this; }
        public JsonWriter EndObject() { sb.Append('}'); needComma = true; return this; }
        public JsonWriter BeginArray() { Sep(); sb.Append('['); needComma = false; return this; }
        public JsonWriter EndArray() { sb.Append(']'); needComma = true; return this; }

        /// <summary>The next member's name (inside an object); the value follows.</summary>
        public JsonWriter Name(string name) { Sep(); Quote(name); sb.Append(':'); needComma = false; return this; }

        public JsonWriter Null() { Sep(); sb.Append("null"); return this; }
        /// <summary>An already written JSON value, as it is.</summary>
        public JsonWriter Raw(string json) { Sep(); sb.Append(json); needComma = true; return this; }
        public JsonWriter Bool(bool v) { Sep(); sb.Append(v ? "true" : "false"); return this; }
        public JsonWriter Long(long v) { Sep(); sb.Append(v.ToString(CultureInfo.InvariantCulture)); return this; }

        /// <summary>A double; NaN, +Infinity and -Infinity as the strings "nan", "inf" and "-inf" (strict JSON
        /// has no NaN: the run directory's encoding, docs/run-directory.md).</summary>
        public JsonWriter Double(double v)
        {
            Sep();
            if (double.IsNaN(v)) sb.Append("\"nan\"");
            else if (double.IsPositiveInfinity(v)) sb.Append("\"inf\"");
            else if (double.IsNegativeInfinity(v)) sb.Append("\"-inf\"");
            else sb.Append(v.ToString("R", CultureInfo.InvariantCulture));
            return this;
        }

        /// <summary>A double, or null when it is NaN because it was not measured. Never for a measured value:
        /// a NaN gradient norm is a finding (OC501), and null would hide it.</summary>
        public JsonWriter DoubleOrNull(double v) { return double.IsNaN(v) ? Null() : Double(v); }

        public JsonWriter String(string v)
        {
            Sep();
            if (v == null) sb.Append("null"); else Quote(v);
            return this;
        }

        public JsonWriter Longs(long[] vs)
        {
            BeginArray();
            if (vs != null) foreach (long v in vs) Long(v);
            return EndArray();
        }

        public JsonWriter Strings(IEnumerable<string> vs)
        {
            BeginArray();
            if (vs != null) foreach (string v in vs) String(v);
            return EndArray();
        }

        void Quote(string s)
        {
            sb.Append('"');
            foreach (char c in s) {
                switch (c) {
                    case '"': sb.Append("\\\""); break;
                    case '\\': sb.Append("\\\\"); break;
                    case '\n': sb.Append("\\n"); break;
                    case '\r': sb.Append("\\r"); break;
                    case '\t': sb.Append("\\t"); break;
                    default:
                        if (c < 0x20) sb.Append("\\u").Append(((int)c).ToString("x4", CultureInfo.InvariantCulture));
                        else sb.Append(c);
                        break;
                }
            }
            sb.Append('"');
        }

        public override string ToString() { return sb.ToString(); }
    }

    /// <summary>Reads one JSON document into plain values: Dictionary&lt;string, object&gt; (member order
    /// kept in Keys), List&lt;object&gt;, string, bool, null and numbers as JsonNumber (the literal text,
    /// so a value reaches a trainer exactly as Python wrote it).</summary>
    internal static class JsonReader
    {
        /// <exception cref="FormatException">not one JSON document (the message says where).</exception>
        public static object Parse(string text)
        {
            if (text == null) throw new FormatException("JSON: null input");
            int i = 0;
            object v = Value(text, ref i);
            Ws(text, ref i);
            if (i != text.Length) throw Err(text, i, "trailing characters");
            return v;
        }

        static FormatException Err(string s, int i, string what)
        {
            return new FormatException("JSON: " + what + " at character " + i);
        }

        static void Ws(string s, ref int i)
        {
            while (i < s.Length && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
        }

        static object Value(string s, ref int i)
        {
            Ws(s, ref i);
            if (i >= s.Length) throw Err(s, i, "unexpected end");
            char c = s[i];
            if (c == '{') {
                var d = new Dictionary<string, object>();
                i++; Ws(s, ref i);
                if (i < s.Length && s[i] == '}') { i++; return d; }
                while (true) {
                    Ws(s, ref i);
                    if (i >= s.Length || s[i] != '"') throw Err(s, i, "expected a member name");
                    string k = Str(s, ref i);
                    Ws(s, ref i);
                    if (i >= s.Length || s[i] != ':') throw Err(s, i, "expected ':'");
                    i++;
                    d[k] = Value(s, ref i);
                    Ws(s, ref i);
                    if (i < s.Length && s[i] == ',') { i++; continue; }
                    if (i < s.Length && s[i] == '}') { i++; return d; }
                    throw Err(s, i, "expected ',' or '}'");
                }
            }
            if (c == '[') {
                var l = new List<object>();
                i++; Ws(s, ref i);
                if (i < s.Length && s[i] == ']') { i++; return l; }
                while (true) {
                    l.Add(Value(s, ref i));
                    Ws(s, ref i);
                    if (i < s.Length && s[i] == ',') { i++; continue; }
                    if (i < s.Length && s[i] == ']') { i++; return l; }
                    throw Err(s, i, "expected ',' or ']'");
                }
            }
            if (c == '"') return Str(s, ref i);
            if (Word(s, ref i, "true")) return true;
            if (Word(s, ref i, "false")) return false;
            if (Word(s, ref i, "null")) return null;
            if (Word(s, ref i, "NaN")) return new JsonNumber("NaN");
            if (Word(s, ref i, "Infinity")) return new JsonNumber("Infinity");
            if (Word(s, ref i, "-Infinity")) return new JsonNumber("-Infinity");
            int start = i;
            while (i < s.Length && "+-0123456789.eE".IndexOf(s[i]) >= 0) i++;
            if (i == start) throw Err(s, i, "unexpected character '" + c + "'");
            string num = s.Substring(start, i - start);
            double ignored;
            if (!double.TryParse(num, NumberStyles.Float, CultureInfo.InvariantCulture, out ignored))
                throw Err(s, start, "bad number '" + num + "'");
            return new JsonNumber(num);
        }

        static bool Word(string s, ref int i, string w)
        {
            if (string.CompareOrdinal(s, i, w, 0, w.Length) != 0) return false;
            i += w.Length;
            return true;
        }

        static string Str(string s, ref int i)
        {
            var sb = new StringBuilder();
            i++;  // the opening quote
            while (i < s.Length) {
                char c = s[i++];
                if (c == '"') return sb.ToString();
                if (c != '\\') { sb.Append(c); continue; }
                if (i >= s.Length) break;
                char e = s[i++];
                switch (e) {
                    case '"': sb.Append('"'); break;
                    case '\\': sb.Append('\\'); break;
                    case '/': sb.Append('/'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'n': sb.Append('\n'); break;
                    case 'r': sb.Append('\r'); break;
                    case 't': sb.Append('\t'); break;
                    case 'u':
                        if (i + 4 > s.Length) throw Err(s, i, "short \\u escape");
                        sb.Append((char)int.Parse(s.Substring(i, 4), NumberStyles.HexNumber, CultureInfo.InvariantCulture));
                        i += 4;
                        break;
                    default: throw Err(s, i - 1, "bad escape '\\" + e + "'");
                }
            }
            throw Err(s, i, "unterminated string");
        }
    }

    /// <summary>A JSON number as written (e.g. "0.001", "1337", "NaN").</summary>
    internal sealed class JsonNumber
    {
        public readonly string Text;
        public JsonNumber(string text) { Text = text; }
        public double ToDouble() { return double.Parse(Text, NumberStyles.Float, CultureInfo.InvariantCulture); }
        public override string ToString() { return Text; }
    }
}
