// Ref: boards/dram.py (DramModel, external_storage=True): the data array of the DDR3 timing
//      model in simulation. Amaranth's Memory would carry an initialiser of every word into the
//      RTLIL text (512 MB of DDR3: gigabytes of text); this array has none, and Verilator's
//      --x-initial 0 starts it at zero. Simulation only: no board builds it.
// One read or one byte-masked write per cycle, read data one cycle later (as a block RAM).
module kbtp_dram_storage #(parameter ABITS = 26) (
    input  wire             clk,
    input  wire [ABITS-1:0] addr,
    input  wire             re,
    input  wire [7:0]       we,
    input  wire [63:0]      wdata,
    output reg  [63:0]      rdata
);
    reg [63:0] mem [0:(1 << ABITS) - 1];
    integer k;
    always @(posedge clk) begin
        if (re)
            rdata <= mem[addr];
        for (k = 0; k < 8; k = k + 1)
            if (we[k])
                mem[addr][8 * k +: 8] <= wdata[8 * k +: 8];
    end
endmodule
