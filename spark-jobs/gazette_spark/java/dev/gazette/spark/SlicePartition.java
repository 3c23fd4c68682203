package dev.gazette.spark;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.connector.read.InputPartition;

/** One Spark partition: consecutive pieces of one journal (the plan's slice). */
final class SlicePartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String journal;
    final Piece[] pieces;

    SlicePartition(String journal, Piece[] pieces) {
        this.journal = journal;
        this.pieces = pieces;
    }

    static SlicePartition of(JsonNode slice) {
        JsonNode list = slice.get("pieces");
        Piece[] pieces = new Piece[list.size()];
        for (int i = 0; i < pieces.length; i++) {
            JsonNode p = list.get(i);
            pieces[i] = new Piece(p.get("url").asText(), p.get("where").asText(),
                p.get("codec").asText(), p.get("fragment_begin").asLong(),
                p.get("fragment_end").asLong(), p.get("sha1").asText(),
                p.get("begin").asLong(), p.get("end").asLong(),
                p.get("head_cut").asBoolean(), p.get("tail_cut").asBoolean());
        }
        return new SlicePartition(slice.get("journal").asText(), pieces);
    }
}
