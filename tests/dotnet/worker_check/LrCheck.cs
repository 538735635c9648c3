// Test harness (tests/unit/test_torchsharp_worker_sources.py), compiled with mcs together with
// dotnet/Worker, dotnet/Probe and the signature stub tests/dotnet/torchsharp_stub: runs the parts
// of GptTrainer that touch no tensor — the lr schedule with SoakConfig's defaults, the fault
// list, the optimizer-state field lookup — and prints them, one "key value" per line.
using System;
using System.Globalization;
using OptCheck.Worker;

public static class LrCheck
{
    public static int Main(string[] args)
    {
        var t = new GptTrainer();
        foreach (string a in args) {
            long step = long.Parse(a, CultureInfo.InvariantCulture);
            Console.WriteLine("lr " + step + " " + t.LrAt(step).ToString("R", CultureInfo.InvariantCulture));
        }
        Console.WriteLine("scenarios " + string.Join(",", t.Scenarios));
        Console.WriteLine("state_field " + (TorchSharpTarget.StateField == null ? "none" : TorchSharpTarget.StateField.DeclaringType.FullName + "." + TorchSharpTarget.StateField.Name));
        Console.WriteLine("state_owner " + t.Target.StateOwner.GetType().FullName + " " + t.Target.StateFieldName);
        return 0;
    }
}
