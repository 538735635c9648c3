// Test assembly (tests/integration/test_torchsharp_trainer_options.py): dotnet/Probe plus exactly one
// trainer type, so the worker finds it without --dotnet-trainer. It trains nothing real (a loss that
// falls) and reports the trainer options it received (SoakConfig.extra, "extra.KEY") in its versions,
// which reach the run's summary.json.
using System;
using System.Collections.Generic;
using System.Globalization;
using OptCheck.Contract;
using OptCheck.Probe;

namespace OnlyOne
{
    public sealed class OnlyTrainer : ITrainer, IProbeTarget
    {
        long width;
        string label;
        bool flag;

        public void Setup(string configJson)
        {
            var o = TrainerOptions.FromJson(configJson);
            width = o.Long("extra.width", -1);   // ArgumentException (bad input) when not an integer
            label = o.String("extra.label", "<none>");
            flag = o.Bool("extra.flag", false);
        }

        public double Step(long step, long[] inputs, long[] targets, int batch, int time) { return 5.0 / (1 + step); }
        public double EvalLoss(long[] inputs, long[] targets, int batch, int time) { return double.NaN; }
        IProbeTarget ITrainer.Target { get { return this; } }  // ITrainer, IProbeTarget: internal to the assembly
        public string[] Scenarios { get { return new string[0]; } }
        public string Inject(string name) { throw new ArgumentException("no faults"); }
        public string Lifecycle(string kind) { throw new NotSupportedException("no lifecycle events"); }
        public string[] Versions {
            get {
                return new[] { "trainer_width=" + width.ToString(CultureInfo.InvariantCulture), "trainer_label=" + label,
                               "trainer_flag=" + flag };
            }
        }
        public int Threads { get { return 1; } }

        // IProbeTarget: a model without parameters, an optimizer without groups
        IList<IParameterView> IProbeTarget.ModelParameters() { return new List<IParameterView>(); }
        IList<IParamGroupView> IProbeTarget.ParamGroups() { return new List<IParamGroupView>(); }
        public object StateOwner { get { return null; } }
        public string StateFieldName { get { return null; } }
        StateView IProbeTarget.DescribeState(object key, object value) { return null; }
        public string OptimizerType { get { return "none"; } }
        public long LiveTensors { get { return -1; } }
        public long PeakTensors { get { return -1; } }
    }
}
