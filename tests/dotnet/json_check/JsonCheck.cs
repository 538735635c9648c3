// tests/unit/test_bridge_json.py runs this with mono: the probe's JSON writer and reader and its
// one-pass value statistics, checked from Python (json.loads, numpy, the PyTorch probe's checksum).
//   JsonCheck.exe write            -> one JSON object with awkward strings and non-finite numbers
//   JsonCheck.exe roundtrip FILE   -> FILE's JSON read by JsonReader and written back by JsonWriter
//   JsonCheck.exe values KIND FILE -> "norm checksum" of FILE's raw float32/float64/words32 values
//   JsonCheck.exe probe            -> ProbeCore.Read() of a two-parameter target whose state cannot be read
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Runtime.InteropServices;
using OptCheck.Contract;
using OptCheck.Probe;

/// <summary>A parameter of the probe target below; no TorchSharp.</summary>
sealed class View : IParameterView, IParameterValues
{
    public string Name { get; set; }
    public long Handle { get; set; }
    public long DataPtr { get; set; }
    public bool IsLeaf { get { return true; } }
    public bool RequiresGrad { get { return true; } }
    public long[] Shape { get; set; }
    public string DType { get { return "Float32"; } }     // TorchSharp's spelling: the probe writes float32
    public string Device { get { return "cpu"; } }
    public bool HasGrad { get; set; }
    public double GradNorm() { return 0.25; }
    public bool ReadValues(out double valueNorm, out long checksum) { valueNorm = 2.0; checksum = -5; return true; }
}

sealed class Group : IParamGroupView
{
    public IList<IParameterView> Held = new List<IParameterView>();
    public string[] OptionNames { get { return new[] { "lr", "beta1", "beta2", "amsgrad", "unset" }; } }
    public double[] OptionValues { get { return new[] { 0.001, 0.9, 0.95, 0.0, double.NaN }; } }
    public IList<IParameterView> Members() { return Held; }
}

/// <summary>Two parameters, one group holding the first only; the optimizer object has no _state.</summary>
sealed class Target : IProbeTarget
{
    readonly View a = new View { Name = "emb.weight", Handle = 11, DataPtr = 1100, Shape = new long[] { 4, 2 }, HasGrad = true };
    readonly View b = new View { Name = "head \"bias\"", Handle = 12, DataPtr = 1200, Shape = new long[] { 4 } };
    public IList<IParameterView> ModelParameters() { return new IParameterView[] { a, b }; }
    public IList<IParamGroupView> ParamGroups() { var g = new Group(); g.Held.Add(a); return new IParamGroupView[] { g }; }
    public object StateOwner { get { return new object(); } }
    public string StateFieldName { get { return "_state"; } }
    public StateView DescribeState(object key, object value) { return null; }
    public string OptimizerType { get { return "MyOpt"; } }
    public long LiveTensors { get { return 7; } }
    public long PeakTensors { get { return -1; } }
}

static class JsonCheck
{
    static void Write(JsonWriter w, object v)
    {
        var d = v as Dictionary<string, object>;
        var l = v as List<object>;
        if (d != null) { w.BeginObject(); foreach (var kv in d) { w.Name(kv.Key); Write(w, kv.Value); } w.EndObject(); }
        else if (l != null) { w.BeginArray(); foreach (var x in l) Write(w, x); w.EndArray(); }
        else if (v == null) w.Null();
        else if (v is string) w.String((string)v);
        else if (v is bool) w.Bool((bool)v);
        else w.Double(((JsonNumber)v).ToDouble());
    }

    static int Main(string[] args)
    {
        if (args[0] == "write") {
            var w = new JsonWriter();
            w.BeginObject()
             .Name("quote\"back\\slash").String("tab\tnewline\ncr\rbell\u0007nul\0end \u00e9\u4e2d")
             .Name("nan").Double(double.NaN).Name("inf").Double(double.PositiveInfinity).Name("-inf").Double(double.NegativeInfinity)
             .Name("null_nan").DoubleOrNull(double.NaN).Name("tiny").Double(4.9406564584124654E-324).Name("third").Double(1.0 / 3)
             .Name("big").Long(long.MinValue).Name("longs").Longs(new long[] { 1, -2 }).Name("empty").BeginArray().EndArray()
             .Name("nested").BeginObject().Name("t").Bool(true).Name("f").Bool(false).Name("n").String(null).EndObject()
             .EndObject();
            Console.OutputEncoding = new System.Text.UTF8Encoding(false);
            Console.WriteLine(w.ToString());
            return 0;
        }
        if (args[0] == "probe") {
            Console.WriteLine(new ProbeCore(new Target()).Read());
            return 0;
        }
        if (args[0] == "roundtrip") {
            var w = new JsonWriter();
            try { Write(w, JsonReader.Parse(File.ReadAllText(args[1]))); }
            catch (FormatException e) { Console.WriteLine("FormatException " + e.Message); return 1; }
            Console.OutputEncoding = new System.Text.UTF8Encoding(false);
            Console.WriteLine(w.ToString());
            return 0;
        }
        byte[] raw = File.ReadAllBytes(args[2]);
        GCHandle pin = GCHandle.Alloc(raw, GCHandleType.Pinned);
        try {
            IntPtr p = pin.AddrOfPinnedObject();
            double norm = double.NaN;
            long sum;
            if (args[1] == "float32") ValueStats.Float32(p, raw.Length / 4, out norm, out sum);
            else if (args[1] == "float64") ValueStats.Float64(p, raw.Length / 8, out norm, out sum);
            else sum = ValueStats.Words32(p, raw.Length);
            Console.WriteLine(norm.ToString("R", CultureInfo.InvariantCulture) + " " + sum.ToString(CultureInfo.InvariantCulture));
        } finally {
            pin.Free();
        }
        return 0;
    }
}
