// Reads an optimizer's per-parameter state, which TorchSharp keeps in a non-public field:
// `protected Utils.OrderedDict<IntPtr, OptimizerState> _state` declared on
// TorchSharp.Modules.OptimizerHelper (src/TorchSharp/Optimizers/Optimizer.cs), filled
// `_state[p.Handle] = state` in add_param_group and read `_state[param.handle]` in
// AdamW.step (src/TorchSharp/Optimizers/AdamW.cs). Nothing here names a TorchSharp type:
// the dictionary is found by field name and read through IDictionary<TKey, TValue>'s Keys and
// indexer (TorchSharp's OrderedDict implements it; its non-generic enumerator throws), else as an
// enumerable of KeyValuePair / value tuples.
using System;
using System.Collections;
using System.Collections.Generic;
using System.Reflection;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    internal sealed class StateReader
    {
        const BindingFlags Fields = BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public;

        readonly object owner;
        readonly FieldInfo field;
        PropertyInfo keysProperty;   // IDictionary<K,V>.Keys of the field's current value type
        Type keysFor;

        /// <summary>Why the state cannot be read, or null when it can.</summary>
        public readonly string Problem;

        public StateReader(object owner, string fieldName)
        {
            this.owner = owner;
            if (owner == null) { Problem = "optimizer state not readable: the trainer exposes none (IProbeTarget.StateOwner is null)"; return; }
            if (string.IsNullOrEmpty(fieldName)) fieldName = "_state";
            for (Type t = owner.GetType(); t != null && field == null; t = t.BaseType)
                field = t.GetField(fieldName, Fields | BindingFlags.DeclaredOnly);
            if (field == null)
                Problem = "optimizer state not readable: no field '" + fieldName + "' on " + owner.GetType().FullName +
                          " or its base types (reflection; TorchSharp declares _state on TorchSharp.Modules.OptimizerHelper)";
        }

        public bool Readable { get { return Problem == null; } }

        object Dict()
        {
            return field.GetValue(owner);
        }

        /// <summary>Convert a state key (IntPtr, long, int, ...) to a long handle.</summary>
        public static long KeyToLong(object key)
        {
            if (key is IntPtr) return ((IntPtr)key).ToInt64();
            if (key is long) return (long)key;
            if (key is int) return (int)key;
            if (key is UIntPtr) return (long)((UIntPtr)key).ToUInt64();
            IConvertible c = key as IConvertible;
            if (c != null) return c.ToInt64(null);
            PropertyInfo h = key == null ? null : key.GetType().GetProperty("Handle");
            if (h != null) return KeyToLong(h.GetValue(key, null));
            throw new InvalidCastException("optimizer state key of type " + (key == null ? "null" : key.GetType().FullName) + " is not a handle");
        }

        /// <summary>The state keys as handles, in the dictionary's order. Appends to <paramref name="into"/>.
        /// Returns false (and leaves into unchanged) when the state cannot be read.</summary>
        public bool Keys(List<long> into)
        {
            if (!Readable) return false;
            object d = Dict();
            if (d == null) return true;
            Type dt = d.GetType();
            if (dt != keysFor) { keysFor = dt; keysProperty = FindKeysProperty(dt); }
            IEnumerable keys = keysProperty != null ? keysProperty.GetValue(d, null) as IEnumerable : null;
            if (keys != null) {
                foreach (object k in keys) into.Add(KeyToLong(k));
                return true;
            }
            foreach (object item in (IEnumerable)d) {
                object k, v;
                Split(item, out k, out v);
                into.Add(KeyToLong(k));
            }
            return true;
        }

        /// <summary>Every (key, value) entry of the state; false when it cannot be read.</summary>
        public bool Entries(List<object> keys, List<object> values)
        {
            if (!Readable) return false;
            object d = Dict();
            if (d == null) return true;
            Type dt = d.GetType();
            if (dt != keysFor) { keysFor = dt; keysProperty = FindKeysProperty(dt); }
            // A dictionary is read through its Keys and its indexer, never its non-generic
            // enumerator: TorchSharp's Utils.OrderedDict (the type of OptimizerHelper._state)
            // routes IEnumerable.GetEnumerator() to its KeyValuePair enumerator, which throws
            // NotImplementedException (src/TorchSharp/Utils/OrderedDict.cs, 0.99.6 to 0.107).
            PropertyInfo indexer = keysProperty != null ? keysProperty.DeclaringType.GetProperty("Item") : null;
            IEnumerable dictKeys = indexer != null ? keysProperty.GetValue(d, null) as IEnumerable : null;
            if (dictKeys != null) {
                var ks = new List<object>();
                foreach (object k in dictKeys) ks.Add(k);
                foreach (object k in ks) {
                    keys.Add(k);
                    values.Add(indexer.GetValue(d, new object[] { k }));
                }
                return true;
            }
            IEnumerable e = d as IEnumerable;
            if (e == null) return false;
            foreach (object item in e) {
                object k, v;
                Split(item, out k, out v);
                keys.Add(k);
                values.Add(v);
            }
            return true;
        }

        static PropertyInfo FindKeysProperty(Type t)
        {
            foreach (Type i in t.GetInterfaces()) {
                if (i.IsGenericType && i.GetGenericTypeDefinition() == typeof(IDictionary<,>))
                    return i.GetProperty("Keys");
            }
            if (typeof(IDictionary).IsAssignableFrom(t)) return typeof(IDictionary).GetProperty("Keys");
            return null;
        }

        static void Split(object item, out object key, out object value)
        {
            if (item is DictionaryEntry) {
                DictionaryEntry de = (DictionaryEntry)item;
                key = de.Key; value = de.Value; return;
            }
            Type t = item.GetType();
            PropertyInfo kp = t.GetProperty("Key");
            if (kp != null) {
                key = kp.GetValue(item, null);
                PropertyInfo vp = t.GetProperty("Value");
                value = vp != null ? vp.GetValue(item, null) : null;
                return;
            }
            FieldInfo i1 = t.GetField("Item1"), i2 = t.GetField("Item2");
            if (i1 != null) { key = i1.GetValue(item); value = i2 != null ? i2.GetValue(item) : null; return; }
            key = item; value = null;
        }

        /// <summary>Describe a state value by reflection: a long/int member named "step" is its step
        /// counter; every member whose value has a long[] "shape" property is a state tensor (dtype
        /// from its "dtype" member's ToString(), lower-cased). Null members (e.g. max_exp_avg_sq
        /// without amsgrad) are skipped.</summary>
        public static StateView Describe(object value)
        {
            StateView sv = new StateView();
            if (value == null) return sv;
            const BindingFlags pub = BindingFlags.Instance | BindingFlags.Public;
            foreach (FieldInfo f in value.GetType().GetFields(pub)) Member(sv, f.Name, f.FieldType, f.GetValue(value));
            foreach (PropertyInfo p in value.GetType().GetProperties(pub)) {
                if (p.GetIndexParameters().Length != 0 || !p.CanRead) continue;
                if (p.PropertyType.IsPrimitive && p.Name != "step") continue;
                object v;
                try { v = p.GetValue(value, null); } catch (Exception) { continue; }
                Member(sv, p.Name, p.PropertyType, v);
            }
            return sv;
        }

        static void Member(StateView sv, string name, Type type, object v)
        {
            if (v == null) return;
            if (name == "step" && (v is long || v is int)) { sv.Step = Convert.ToInt64(v); return; }
            if (type.IsPrimitive || v is string) return;
            PropertyInfo shape = v.GetType().GetProperty("shape") ?? v.GetType().GetProperty("Shape");
            if (shape == null || shape.PropertyType != typeof(long[])) return;
            if (sv.TensorNames.Contains(name)) return;
            MemberInfo dt = (MemberInfo)v.GetType().GetProperty("dtype") ?? v.GetType().GetField("dtype");
            object dval = null;
            if (dt is PropertyInfo) dval = ((PropertyInfo)dt).GetValue(v, null);
            else if (dt is FieldInfo) dval = ((FieldInfo)dt).GetValue(v);
            sv.Add(name, (long[])shape.GetValue(v, null), dval == null ? null : DTypes.Normalize(dval.ToString()));
        }
    }

    /// <summary>Element type names in PyTorch's spelling.</summary>
    internal static class DTypes
    {
        /// <summary>"Float32" / "ScalarType.Float32" / "float" -> "float32"; unknown names lower-cased.</summary>
        public static string Normalize(string name)
        {
            if (name == null) return null;
            string n = name;
            int dot = n.LastIndexOf('.');
            if (dot >= 0) n = n.Substring(dot + 1);
            switch (n.ToLowerInvariant()) {
                case "float": case "single": case "float32": return "float32";
                case "double": case "float64": return "float64";
                case "half": case "float16": return "float16";
                case "bfloat16": return "bfloat16";
                case "long": case "int64": return "int64";
                case "int": case "int32": return "int32";
                case "bool": case "boolean": return "bool";
                default: return n.ToLowerInvariant();
            }
        }
    }
}
