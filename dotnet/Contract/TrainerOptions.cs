// The configuration ITrainer.Setup receives: one JSON object (optcheck/torchsharp_bridge/worker.py,
// setup_config) holding SoakConfig's scalar fields, "vocab_size" and "extra" (SoakConfig.extra),
// read here into "name" -> value text, extra entries as "extra.KEY".
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;
using OptCheck.Probe;

namespace OptCheck.Contract
{
    /// <summary>The options ITrainer.Setup receives, parsed from the configuration JSON.</summary>
    public sealed class TrainerOptions
    {
        readonly Dictionary<string, string> values = new Dictionary<string, string>();

        /// <summary>Parse <paramref name="configJson"/>: a JSON object whose scalar members become options by
        /// name and whose "extra" object's members become "extra.KEY". Numbers keep their JSON text, booleans
        /// are "true"/"false", null and "" count as absent, arrays and objects keep their JSON text.</summary>
        /// <exception cref="ArgumentException">not a JSON object (the message says where).</exception>
        public static TrainerOptions FromJson(string configJson)
        {
            object doc;
            try { doc = JsonReader.Parse(configJson); }
            catch (FormatException e) { throw new ArgumentException("Setup: the configuration is not JSON: " + e.Message); }
            var d = doc as Dictionary<string, object>;
            if (d == null) throw new ArgumentException("Setup: the configuration must be a JSON object");
            var o = new TrainerOptions();
            foreach (KeyValuePair<string, object> kv in d) {
                var extra = kv.Value as Dictionary<string, object>;
                if (kv.Key == "extra" && extra != null) {
                    foreach (KeyValuePair<string, object> e in extra) o.Put("extra." + e.Key, e.Value);
                } else {
                    o.Put(kv.Key, kv.Value);
                }
            }
            return o;
        }

        void Put(string name, object v)
        {
            string s = Text(v);
            if (s != null && s != "") values[name] = s;
        }

        static string Text(object v)
        {
            if (v == null) return null;
            if (v is string) return (string)v;
            if (v is bool) return (bool)v ? "true" : "false";
            if (v is JsonNumber) return ((JsonNumber)v).Text;
            var w = new JsonWriter();
            Write(w, v);
            return w.ToString();
        }

        static void Write(JsonWriter w, object v)
        {
            var d = v as Dictionary<string, object>;
            var l = v as List<object>;
            if (d != null) {
                w.BeginObject();
                foreach (KeyValuePair<string, object> kv in d) { w.Name(kv.Key); Write(w, kv.Value); }
                w.EndObject();
            } else if (l != null) {
                w.BeginArray();
                foreach (object x in l) Write(w, x);
                w.EndArray();
            } else if (v == null) w.Null();
            else if (v is string) w.String((string)v);
            else if (v is bool) w.Bool((bool)v);
            else w.Double(((JsonNumber)v).ToDouble());
        }

        public IDictionary<string, string> Values { get { return values; } }

        public bool TryGet(string name, out string value) { return values.TryGetValue(name, out value); }

        public string String(string name, string dflt)
        {
            string v;
            return values.TryGetValue(name, out v) ? v : dflt;
        }

        /// <exception cref="ArgumentException">present but not an integer.</exception>
        public long Long(string name, long dflt)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return dflt;
            long r;
            if (long.TryParse(v, NumberStyles.Integer, CultureInfo.InvariantCulture, out r)) return r;
            double d;
            if (double.TryParse(v, NumberStyles.Float, CultureInfo.InvariantCulture, out d) && d == Math.Floor(d)) return (long)d;
            throw new ArgumentException(name + ": expected an integer, got '" + v + "'");
        }

        /// <exception cref="ArgumentException">present but not a number.</exception>
        public double Double(string name, double dflt)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return dflt;
            double r;
            if (double.TryParse(v, NumberStyles.Float, CultureInfo.InvariantCulture, out r)) return r;
            throw new ArgumentException(name + ": expected a number, got '" + v + "'");
        }

        /// <exception cref="ArgumentException">present but not true/false.</exception>
        public bool Bool(string name, bool dflt)
        {
            string v;
            if (!values.TryGetValue(name, out v)) return dflt;
            if (v == "true" || v == "True") return true;
            if (v == "false" || v == "False") return false;
            throw new ArgumentException(name + ": expected true or false, got '" + v + "'");
        }
    }
}
