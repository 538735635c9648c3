// `dotnet OptCheck.Worker.dll --selftest [STEPS]`: a check of a build without Python — trains the
// GPT a few steps on a repeating byte pattern through the same Driver the Python worker uses,
// prints the losses, the pre-step check and what the probe reads, and exits 0 when the loss fell
// and the check is clean. optcheck itself loads this assembly through pythonnet and never runs Main.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using OptCheck.Contract;
using OptCheck.Probe;

namespace OptCheck.Worker
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            if (args.Length == 0 || args[0] != "--selftest") {
                Console.Error.WriteLine("usage: dotnet OptCheck.Worker.dll --selftest [STEPS] " +
                                        "(optcheck loads this assembly through pythonnet; Main is only this self-test)");
                return 2;
            }
            int n = args.Length > 1 ? int.Parse(args[1], CultureInfo.InvariantCulture) : 40;
            const int B = 4, T = 16;
            var trainer = new GptTrainer();
            var driver = new Driver(trainer);
            driver.Setup("{\"steps\": " + n.ToString(CultureInfo.InvariantCulture) + ", \"warmup_steps\": 5, \"lr\": 0.003, " +
                         "\"block_size\": 16, \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"threads\": 1}");
            Console.WriteLine(string.Join(" ", trainer.Versions));
            double first = double.NaN, last = double.NaN;
            var x = new long[B * T];
            var y = new long[B * T];
            for (int step = 1; step <= n; step++) {
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < T; t++) {
                        x[b * T + t] = 97 + (b + t + step) % 7;
                        y[b * T + t] = 97 + (b + t + step + 1) % 7;
                    }
                string check = driver.PreStepCheck();
                if (check.Length > 0) { Console.WriteLine("pre-step check before step " + step + ":\n" + check); return 1; }
                last = trainer.Step(step, x, y, B, T);
                if (step == 1) first = last;
                if (step == 1 || step % 10 == 0) Console.WriteLine("step " + step + " loss " + last.ToString("F4", CultureInfo.InvariantCulture));
            }
            // the snapshot body as the Python worker reads it, parsed back: a check of the JSON writer too
            var body = (Dictionary<string, object>)JsonReader.Parse(driver.Probe());
            var ps = (List<object>)body["params"];
            var names = ps.Select(o => (string)((Dictionary<string, object>)o)["name"]).ToArray();
            int handles = ps.Select(o => ((Dictionary<string, object>)o)["ref"].ToString()).Distinct().Count();
            int sums = ps.Count(o => ((Dictionary<string, object>)o)["checksum"] != null);
            var state = body["state"] as List<object>;
            Console.WriteLine(names.Length + " parameters, " + handles + " handles, " + sums + " checksums, " +
                              (state == null ? "state not readable" : state.Count + " state keys") +
                              (TensorFacts.DataPtrProblem != null ? "; " + TensorFacts.DataPtrProblem : ""));
            Console.WriteLine(string.Join(" ", names));
            bool ok = last < first && state != null && state.Count == names.Length && sums == names.Length;
            Console.WriteLine(ok ? "selftest ok" : "selftest FAILED");
            return ok ? 0 : 1;
        }
    }
}
